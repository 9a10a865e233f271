//! Admission webhooks of a manager running as a local process, registered with the API server
//! as envtest does: the provider's `config/webhook/manifests.yaml` (which points at an
//! in-cluster Service) is rewritten so that each webhook calls
//! `https://127.0.0.1:<port>/<path>` and trusts the test control plane's CA.

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use capl_testbed::wait::{self, Bound, Check, Stop};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client, Config};
use serde::Deserialize;

/// How long the API server may take to start calling newly registered webhooks.
const REGISTERED_TIMEOUT: Duration = Duration::from_secs(30);
/// The label a probe object carries; only the probe webhooks select it.
const PROBE_LABEL: &str = "capl-testenv-webhook-probe";
/// Where the probe webhooks point: a path the manager does not serve, so a call fails.
const PROBE_PATH: &str = "/capl-testenv-webhook-probe";

/// One webhook configuration of a manifest, rewritten for a local server.
#[derive(Debug, Clone)]
pub enum WebhookConfiguration {
    Mutating(MutatingWebhookConfiguration),
    Validating(ValidatingWebhookConfiguration),
}

impl WebhookConfiguration {
    pub fn name(&self) -> &str {
        let metadata = match self {
            Self::Mutating(config) => &config.metadata,
            Self::Validating(config) => &config.metadata,
        };
        metadata.name.as_deref().unwrap_or_default()
    }
}

/// The webhook configurations of `yaml` (a provider's `config/webhook/manifests.yaml`), each
/// named `<name_prefix>-mutating` or `<name_prefix>-validating`, with every webhook's client
/// pointing at `https://127.0.0.1:<port><service.path>` and trusting `ca_pem`. `origin` names
/// the text in errors.
pub fn rewrite_for_local_server(
    yaml: &str,
    origin: &str,
    name_prefix: &str,
    port: u16,
    ca_pem: &str,
) -> Result<Vec<WebhookConfiguration>> {
    let client_config = |service_path: Option<&str>, webhook: &str| -> Result<WebhookClientConfig> {
        let path =
            service_path.with_context(|| format!("webhook {webhook} of {origin} has no clientConfig.service.path"))?;
        Ok(WebhookClientConfig {
            url: Some(format!("https://127.0.0.1:{port}{path}")),
            ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
            service: None,
        })
    };
    let mut configurations = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let value = serde_yaml::Value::deserialize(document)
            .with_context(|| format!("document {index} of {origin} is not valid YAML"))?;
        if value.is_null() {
            continue;
        }
        let kind = value.get("kind").and_then(serde_yaml::Value::as_str).unwrap_or("<none>").to_owned();
        let invalid = || format!("document {index} of {origin} is not a valid {kind}");
        let configuration = match kind.as_str() {
            "MutatingWebhookConfiguration" => {
                let mut config: MutatingWebhookConfiguration = serde_yaml::from_value(value).with_context(invalid)?;
                config.metadata = ObjectMeta { name: Some(format!("{name_prefix}-mutating")), ..Default::default() };
                for webhook in config.webhooks.iter_mut().flatten() {
                    let path = webhook.client_config.service.as_ref().and_then(|s| s.path.as_deref());
                    webhook.client_config = client_config(path, &webhook.name)?;
                }
                WebhookConfiguration::Mutating(config)
            }
            "ValidatingWebhookConfiguration" => {
                let mut config: ValidatingWebhookConfiguration = serde_yaml::from_value(value).with_context(invalid)?;
                config.metadata = ObjectMeta { name: Some(format!("{name_prefix}-validating")), ..Default::default() };
                for webhook in config.webhooks.iter_mut().flatten() {
                    let path = webhook.client_config.service.as_ref().and_then(|s| s.path.as_deref());
                    webhook.client_config = client_config(path, &webhook.name)?;
                }
                WebhookConfiguration::Validating(config)
            }
            other => bail!(
                "document {index} of {origin} has kind {other:?}, expected a Mutating or ValidatingWebhookConfiguration"
            ),
        };
        configurations.push(configuration);
    }
    if configurations.is_empty() {
        bail!("{origin} holds no webhook configuration");
    }
    Ok(configurations)
}

/// Webhook configurations created on an API server; deleted when dropped.
pub struct Registration {
    config: Config,
    configurations: Vec<WebhookConfiguration>,
}

impl Registration {
    /// Creates the webhook configurations of `manifest` for a server on 127.0.0.1:`port` whose
    /// certificate `ca_pem` signed, and waits until the API server calls them.
    pub async fn register(config: &Config, manifest: &Path, provider: &str, port: u16, ca_pem: &str) -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let yaml = std::fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
        let prefix = format!("capl-testenv-{provider}-{unique}");
        let configurations = rewrite_for_local_server(&yaml, &manifest.display().to_string(), &prefix, port, ca_pem)?;
        let client = Client::try_from(config.clone())?;
        // Registered before creating anything, so that a failure half-way removes what exists.
        let mut registration = Self { config: config.clone(), configurations: Vec::new() };
        for configuration in configurations {
            create(&client, &configuration).await?;
            registration.configurations.push(configuration);
        }
        // The API server picks webhook configurations up through a watch. Probe webhooks,
        // created after the provider's, are called once it has seen them, and with them
        // every configuration created earlier.
        let probe_prefix = format!("capl-testenv-probe-{unique}");
        let probes = [
            WebhookConfiguration::Mutating(probe_mutating(&probe_prefix, port, ca_pem)),
            WebhookConfiguration::Validating(probe_validating(&probe_prefix, port, ca_pem)),
        ];
        for probe in &probes {
            create(&client, probe).await?;
            registration.configurations.push(probe.clone());
        }
        for probe in &probes {
            wait_until_called(&client, probe.name()).await?;
        }
        for probe in &probes {
            delete_configuration(&client, probe).await;
        }
        registration.configurations.retain(|c| !c.name().starts_with(&probe_prefix));
        Ok(registration)
    }

    /// The names of the created configurations.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.configurations.iter().map(WebhookConfiguration::name)
    }
}

impl Drop for Registration {
    /// Deletes the configurations, so that an API server that outlives the manager does not
    /// call a server that is gone (every CAPI webhook fails closed). Drop cannot await, so the
    /// deletion runs on a thread of its own with its own runtime.
    fn drop(&mut self) {
        if self.configurations.is_empty() {
            return;
        }
        let config = self.config.clone();
        let configurations = std::mem::take(&mut self.configurations);
        let deleted = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                let Ok(client) = Client::try_from(config) else { return };
                let deletions = async {
                    for configuration in &configurations {
                        delete_configuration(&client, configuration).await;
                    }
                };
                // A stopped API server must not hold a test up.
                let _ = tokio::time::timeout(Duration::from_secs(15), deletions).await;
            });
        });
        let _ = deleted.join();
    }
}

async fn create(client: &Client, configuration: &WebhookConfiguration) -> Result<()> {
    let name = configuration.name();
    let created = match configuration {
        WebhookConfiguration::Mutating(config) => Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), config)
            .await
            .map(drop),
        WebhookConfiguration::Validating(config) => Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), config)
            .await
            .map(drop),
    };
    created.with_context(|| format!("the API server rejected webhook configuration {name}"))
}

async fn delete_configuration(client: &Client, configuration: &WebhookConfiguration) {
    let params = DeleteParams::default();
    let name = configuration.name();
    let _ = match configuration {
        WebhookConfiguration::Mutating(_) => {
            Api::<MutatingWebhookConfiguration>::all(client.clone()).delete(name, &params).await.map(drop)
        }
        WebhookConfiguration::Validating(_) => {
            Api::<ValidatingWebhookConfiguration>::all(client.clone()).delete(name, &params).await.map(drop)
        }
    };
}

/// A probe webhook: selects only ConfigMaps labelled `PROBE_LABEL=<name>`, and fails when called.
fn probe_manifest(name: &str, port: u16, ca_pem: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.probe.capl.testenv"),
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "objectSelector": {"matchLabels": {PROBE_LABEL: name}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}],
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}{PROBE_PATH}"),
                "caBundle": ByteString(ca_pem.as_bytes().to_vec()),
            },
        }],
    })
}

fn probe_mutating(prefix: &str, port: u16, ca_pem: &str) -> MutatingWebhookConfiguration {
    serde_json::from_value(probe_manifest(&format!("{prefix}-mutating"), port, ca_pem))
        .expect("the probe manifest is a MutatingWebhookConfiguration")
}

fn probe_validating(prefix: &str, port: u16, ca_pem: &str) -> ValidatingWebhookConfiguration {
    serde_json::from_value(probe_manifest(&format!("{prefix}-validating"), port, ca_pem))
        .expect("the probe manifest is a ValidatingWebhookConfiguration")
}

/// Dry-run creates a ConfigMap that only the probe `name` selects until the API server's
/// answer names that webhook (the call failed, so the API server knows it).
async fn wait_until_called(client: &Client, name: &str) -> Result<()> {
    let webhook = format!("{name}.probe.capl.testenv");
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let probe = ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some("capl-testenv-webhook-probe-".to_owned()),
            labels: Some([(PROBE_LABEL.to_owned(), name.to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    let bound = Bound::new(REGISTERED_TIMEOUT, Duration::from_millis(100));
    let outcome = wait::until(bound, || async {
        Ok::<_, Infallible>(match config_maps.create(&dry_run, &probe).await {
            Err(kube::Error::Api(status)) if status.message.contains(&webhook) => Check::Done(()),
            Err(err) => Check::Pending(format!("{err}")),
            Ok(_) => Check::Pending("the dry-run create was admitted without calling it".to_owned()),
        })
    })
    .await;
    if let Err(Stop::TimedOut(last)) = outcome {
        bail!("the API server did not call webhook {webhook} within {REGISTERED_TIMEOUT:?} (last: {last})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-x}
  failurePolicy: Fail
  name: default.x.example.io
  rules: [{apiGroups: [example.io], apiVersions: [v1], operations: [CREATE], resources: [xs]}]
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-x}
  failurePolicy: Fail
  name: validation.x.example.io
  rules: [{apiGroups: [example.io], apiVersions: [v1], operations: [CREATE], resources: [xs]}]
  sideEffects: None
";

    #[test]
    fn service_references_become_local_urls_trusting_the_ca() {
        let configurations = rewrite_for_local_server(MANIFEST, "manifest", "p", 9443, "CA").unwrap();
        let [WebhookConfiguration::Mutating(mutating), WebhookConfiguration::Validating(validating)] =
            configurations.as_slice()
        else {
            panic!("expected one mutating and one validating configuration: {configurations:?}");
        };
        assert_eq!(mutating.metadata.name.as_deref(), Some("p-mutating"));
        assert_eq!(validating.metadata.name.as_deref(), Some("p-validating"));
        let mutate = &mutating.webhooks.as_ref().unwrap()[0].client_config;
        assert_eq!(mutate.url.as_deref(), Some("https://127.0.0.1:9443/mutate-x"));
        assert_eq!(mutate.ca_bundle, Some(ByteString(b"CA".to_vec())));
        assert!(mutate.service.is_none());
        let validate = &validating.webhooks.as_ref().unwrap()[0].client_config;
        assert_eq!(validate.url.as_deref(), Some("https://127.0.0.1:9443/validate-x"));
    }

    #[test]
    fn other_kinds_and_webhooks_without_a_path_are_refused() {
        let error = rewrite_for_local_server("kind: ConfigMap\n", "cm.yaml", "p", 1, "CA").unwrap_err();
        assert!(format!("{error:#}").contains("cm.yaml"), "{error:#}");
        let no_path = MANIFEST.replace(", path: /mutate-x", "");
        let error = rewrite_for_local_server(&no_path, "m.yaml", "p", 1, "CA").unwrap_err();
        assert!(format!("{error:#}").contains("default.x.example.io"), "{error:#}");
    }
}
