// HTTP serving: the metasync API's lookup endpoint against a bare net/http
// handler, under the same load.

package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/iidp/metasync/internal/api"
	msync "github.com/iidp/metasync/sync"
)

// measureHTTP drives a bare net/http handler that returns a fixed JSON body
// and the API's lookup endpoint with the same load generator.
func measureHTTP(e *msync.Engine, keys []string) (bare, lookup float64) {
	body := []byte(`{"index":"model-to-app","key":"model-000001-0","values":["app-000001"]}` + "\n")
	bareSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	defer bareSrv.Close()
	apiSrv := httptest.NewServer(api.New(e, quiet))
	defer apiSrv.Close()
	logf("HTTP: bare handler")
	bare = load(bareSrv.URL+"/v1/indexes/model-to-app/keys/", keys)
	logf("HTTP: metasync API")
	lookup = load(apiSrv.URL+"/v1/indexes/model-to-app/keys/", keys)
	return bare, lookup
}

// load sends GETs of prefix+key, going round the keys, from -http-conns
// clients for -http and returns the requests per second that got a
// response.
func load(prefix string, keys []string) float64 {
	tr := &http.Transport{MaxIdleConnsPerHost: *httpConns, MaxConnsPerHost: *httpConns}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var total atomic.Int64
	deadline := time.Now().Add(*httpDur)
	var wg gosync.WaitGroup
	for c := range *httpConns {
		wg.Go(func() {
			i := c * 1000
			for time.Now().Before(deadline) {
				resp, err := client.Get(prefix + keys[i%len(keys)])
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				total.Add(1)
				i++
			}
		})
	}
	wg.Wait()
	return float64(total.Load()) / httpDur.Seconds()
}
