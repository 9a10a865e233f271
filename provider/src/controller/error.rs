//! The error that ends a reconcile early.

/// Errors that end a reconcile early; they are retried with a backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0} has no namespace: the kinds are namespaced, this is a bug")]
    NoNamespace(String),
}

impl Error {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api_status",
            Error::Kube(_) => "api_transport",
            Error::NoNamespace(_) => "no_namespace",
        }
    }
}
