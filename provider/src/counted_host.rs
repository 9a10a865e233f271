//! Counting what the manager asks of its hosts: a [`Connector`] that wraps
//! every connection it opens so that each libvirt call (and each connection)
//! is counted in the manager's metrics (`capl_libvirt_calls_total{call}`,
//! `capl_libvirt_connections_opened_total`). The benchmarks and an operator
//! read them to see what a machine costs its host.

use std::sync::Arc;

use capl_host::hypervisor::observed::{Observed, Rpc, RpcObserver};
use capl_host::hypervisor::{Connector, Hypervisor, Result};

use crate::controller::metrics::Metrics;

/// Wraps `inner`: the connections it opens count their calls in `metrics`.
pub struct CountingConnector {
    inner: Arc<dyn Connector>,
    metrics: Metrics,
}

impl CountingConnector {
    pub fn new(inner: Arc<dyn Connector>, metrics: Metrics) -> Self {
        Self { inner, metrics }
    }
}

impl Connector for CountingConnector {
    fn connect(&self, uri: &str) -> Result<Arc<dyn Hypervisor>> {
        let inner = self.inner.connect(uri)?;
        self.metrics.connection_opened();
        Ok(Arc::new(Observed::new(inner, Counter(self.metrics.clone()))))
    }
}

/// Counts each call of a connection in the metrics, under the call's name.
struct Counter(Metrics);

impl RpcObserver for Counter {
    type Guard = ();

    fn begin(&self, rpc: Rpc) {
        self.0.libvirt_call(rpc.name);
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::*;

    #[test]
    fn calls_and_connections_are_counted() {
        let uri = "test:///counted-host";
        let _host = capl_host::sim_host::register(uri).expect("sim host");
        let metrics = Metrics::default();
        let connector = CountingConnector::new(Arc::new(capl_host::hypervisor::sim::SimConnector), metrics.clone());
        let conn = connector.connect(uri).expect("connect");
        assert!(conn.network_is_active(capl_host::sim_host::NETWORK).expect("call"));
        conn.pool_is_active(capl_host::sim_host::BASE_POOL).expect("call");
        conn.pool_is_active(capl_host::sim_host::DOMAIN_POOL).expect("call");
        assert!(conn.is_alive());
        let text = metrics.encode();
        assert!(text.contains("capl_libvirt_calls_total{call=\"network_is_active\"} 1"), "{text}");
        assert!(text.contains("capl_libvirt_calls_total{call=\"pool_is_active\"} 2"), "{text}");
        assert!(text.contains("capl_libvirt_connections_opened_total 1"), "{text}");
    }
}
