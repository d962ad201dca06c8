package main

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/schema/cluster"
)

// installCRDs checks the config's paths against the CRD files it lists,
// installs them and waits until each is established.
func installCRDs(plan *schema.Plan, cfg *rest.Config, log *slog.Logger) error {
	crds, err := schema.ReadCRDs(plan.CRDs())
	if err != nil {
		return err
	}
	notes, err := schema.CheckPaths(plan, crds)
	for _, n := range notes {
		log.Info("path check", "note", n)
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	if err := cluster.InstallCRDs(ctx, cfg, crds, 60*time.Second); err != nil {
		return err
	}
	names := make([]string, len(crds))
	for i, c := range crds {
		names[i] = c.Name
	}
	log.Info("CRDs installed and established", "crds", names, "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}
