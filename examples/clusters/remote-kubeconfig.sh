#!/bin/sh
# Writes west's kubeconfig from the token of remote-reader.yaml and gives
# it to the daemon's cluster as a Secret (deployment-patch.yaml mounts it).
# Usage: remote-kubeconfig.sh WEST_SERVER WEST_CA_FILE
set -eu
server=$1 ca=$2
token=$(kubectl --context west -n metasync get secret metasync-reader-token -o jsonpath='{.data.token}' | base64 -d)
kubectl config --kubeconfig west.kubeconfig set-cluster west --server "$server" --certificate-authority "$ca" --embed-certs
kubectl config --kubeconfig west.kubeconfig set-credentials reader --token "$token"
kubectl config --kubeconfig west.kubeconfig set-context west-reader --cluster west --user reader
kubectl config --kubeconfig west.kubeconfig use-context west-reader
kubectl --context east -n metasync create secret generic metasync-cluster-west --from-file=kubeconfig=west.kubeconfig
