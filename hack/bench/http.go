// HTTP serving: `metasync serve`'s lookup endpoint against a bare net/http
// handler, each in a process of its own, under the same load.

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	gosync "sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// bareBody is what the bare handler answers: a lookup's answer.
var bareBody = []byte(`{"index":"model-to-app","key":"model-000001-0","values":["app-000001"]}` + "\n")

// serveBare is the bare-http child: a net/http handler that answers
// bareBody to every request, on addr, until killed.
func serveBare(addr string) error {
	return http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(bareBody)
	}))
}

// startBare runs this program as the bare-http child on a free loopback
// port and waits until it answers; stop kills it.
func startBare() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr = ln.Addr().String()
	ln.Close()
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self, "-child", "bare-http", "-child-listen", addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for deadline := time.Now().Add(10 * time.Second); ; {
		if resp, err := http.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("the bare HTTP child does not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// measureHTTP drives, with the same load generator, a bare net/http
// handler that returns a fixed JSON body (this program as a child) and
// the lookup endpoint of `metasync serve` (-metasync) over the bench's
// AppModels.
func measureHTTP(cfg *rest.Config, keys []string) (bare, lookup float64, err error) {
	if _, err := os.Stat(*metasyncBin); err != nil {
		return 0, 0, fmt.Errorf("-metasync %s: %w (make bench builds it)", *metasyncBin, err)
	}
	dir, kubeconfig, err := workDir(cfg, "bench-http-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	bareAddr, stopBare, err := startBare()
	if err != nil {
		return 0, 0, err
	}
	defer stopBare()
	p, err := startServe(kubeconfig, ns, dir)
	if err != nil {
		return 0, 0, err
	}
	defer p.stop()
	logf("HTTP: bare handler")
	bare = load("http://"+bareAddr+"/v1/indexes/model-to-app/keys/", keys)
	logf("HTTP: metasync serve")
	lookup = load("http://"+p.addr+"/v1/indexes/model-to-app/keys/", keys)
	return bare, lookup, nil
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
