"""Tests of the deployment files under deploy/ (Kubernetes manifests and the Helm chart)."""
