//! Prometheus metrics of the manager, served on `--metrics-bind-address`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

/// The manager's metrics; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    host_operations: Family<OperationLabels, Histogram>,
    domain_events: Family<OutcomeLabels, Counter>,
    host_relists: Counter,
    create_steps: Family<StepLabels, Histogram>,
    libvirt_calls: Family<CallLabels, Counter>,
    connections_opened: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    call: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("capl");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let host_operations = Family::<OperationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        registry.register("reconciles", "Reconciles run, by controller", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed or reported a failure, by controller and reason",
            errors.clone(),
        );
        registry.register("reconcile_duration_seconds", "Reconcile duration, by controller", durations.clone());
        registry.register(
            "libvirt_operation_duration_seconds",
            "Duration of host operations (each a sequence of libvirt calls), by operation",
            host_operations.clone(),
        );
        let domain_events = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "domain_events",
            "Domain lifecycle events received from libvirt hosts, by outcome: reconcile (a LibvirtMachine's domain), own (caused by the reconciler's own create or start: no reconcile) or ignored (not ours)",
            domain_events.clone(),
        );
        let host_relists = Counter::default();
        registry.register(
            "host_relists",
            "Times every LibvirtMachine of a host was reconciled because its domain events may have been lost (a reconnect)",
            host_relists.clone(),
        );
        let create_steps = Family::<StepLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        registry.register(
            "create_step_duration_seconds",
            "Duration of each step of creating a machine on its host (disk, iso_volume, iso_upload, reservation, define, autostart, start)",
            create_steps.clone(),
        );
        let libvirt_calls = Family::<CallLabels, Counter>::default();
        registry.register("libvirt_calls", "libvirt calls made, by call", libvirt_calls.clone());
        let connections_opened = Counter::default();
        registry.register("libvirt_connections_opened", "libvirt connections opened", connections_opened.clone());
        Self {
            registry: Arc::new(registry),
            create_steps,
            libvirt_calls,
            connections_opened,
            reconciles,
            errors,
            durations,
            host_operations,
            domain_events,
            host_relists,
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, controller: &str, took: Duration) {
        let labels = ControllerLabels { controller: controller.into() };
        self.reconciles.get_or_create(&labels).inc();
        self.durations.get_or_create(&labels).observe(took.as_secs_f64());
    }

    pub fn reconcile_error(&self, controller: &str, reason: &str) {
        self.errors.get_or_create(&ErrorLabels { controller: controller.into(), reason: reason.into() }).inc();
    }

    pub fn host_operation(&self, operation: &str, took: Duration) {
        self.host_operations
            .get_or_create(&OperationLabels { operation: operation.into() })
            .observe(took.as_secs_f64());
    }

    /// A domain event received; `ours`: it concerns a LibvirtMachine.
    /// A domain lifecycle event arrived: `reconcile` (a LibvirtMachine's
    /// domain, reconciled), `own` (a LibvirtMachine's domain, caused by the
    /// reconciler's own action: no reconcile) or `ignored` (not ours).
    pub fn domain_event(&self, outcome: &'static str) {
        self.domain_events.get_or_create(&OutcomeLabels { outcome: outcome.into() }).inc();
    }

    pub fn host_relisted(&self) {
        self.host_relists.inc();
    }

    /// One create step of one machine ran for `took`.
    pub fn create_step(&self, step: &'static str, took: Duration) {
        self.create_steps.get_or_create(&StepLabels { step }).observe(took.as_secs_f64());
    }

    /// One libvirt call was made (see [`crate::counted_host`]).
    pub fn libvirt_call(&self, call: &'static str) {
        self.libvirt_calls.get_or_create(&CallLabels { call }).inc();
    }

    /// One libvirt connection was opened.
    pub fn connection_opened(&self) {
        self.connections_opened.inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
