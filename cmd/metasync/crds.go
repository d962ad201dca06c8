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
	crds, err := readCRDs(plan, log)
	if err != nil {
		return err
	}
	return applyCRDs(crds, cfg, log)
}

// readCRDs reads the CRD files the config lists and checks the config's
// paths against them.
func readCRDs(plan *schema.Plan, log *slog.Logger) ([]*cluster.CRD, error) {
	crds, err := cluster.ReadCRDs(plan.CRDs())
	if err != nil {
		return nil, err
	}
	notes, err := cluster.CheckPaths(plan, crds)
	for _, n := range notes {
		log.Info("path check", "note", n)
	}
	if err != nil {
		return nil, err
	}
	return crds, nil
}

// installLater installs the CRDs once the apiserver can be reached, trying
// every 10 s until ctx ends: a warm start serves its snapshot meanwhile.
func installLater(ctx context.Context, crds []*cluster.CRD, cfg *rest.Config, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
		}
		err := applyCRDs(crds, cfg, log)
		if err == nil {
			return
		}
		log.Warn("CRDs not installed yet: answering from the snapshot meanwhile", "error", err.Error())
	}
}

// applyCRDs installs the CRDs and waits until each is established.
func applyCRDs(crds []*cluster.CRD, cfg *rest.Config, log *slog.Logger) error {
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

// checkInstalledPaths checks the config's paths against the schemas of
// the CRDs installed in the cluster (those that its crds: files do not
// define), as validate --cluster does, for at most within. It fails with
// the problems, each with its field path; what it could not check (the
// apiserver away, a CRD that RBAC does not let it read) is logged and
// fails nothing.
func checkInstalledPaths(plan *schema.Plan, cfg *rest.Config, within time.Duration, log *slog.Logger) error {
	files, _ := cluster.ReadCRDs(plan.CRDs()) // their problems are readCRDs'
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	notes, err := cluster.CheckInstalledPaths(ctx, plan, cfg, files)
	for _, n := range notes {
		log.Info("path check", "note", n)
	}
	return err
}
