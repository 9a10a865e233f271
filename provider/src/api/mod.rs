//! The `infrastructure.cluster.x-k8s.io/v1alpha1` API.
