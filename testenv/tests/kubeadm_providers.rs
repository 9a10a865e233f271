//! CAPI's kubeadm bootstrap (CABPK) and control plane (KCP) managers run beside the core
//! manager, and the API server calls their webhooks as in a cluster installed with
//! clusterctl: objects come back defaulted, invalid ones are refused with the provider's
//! message, and stopping the managers unregisters the webhooks.
//!
//! Needs `cargo xtask control-plane build` (it builds the three managers and copies CAPI's
//! CRDs and webhook manifests).

use anyhow::{Context, Result};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use testenv::{CapiOptions, TestEnv};

fn api(client: &Client, namespace: &str, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1beta2", kind);
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, plural))
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a test object is a valid DynamicObject")
}

/// A KubeadmControlPlane as a user might write it: no replicas, no rollout strategy, and a
/// version without the leading `v`.
fn kubeadm_control_plane(name: &str, replicas: Option<i64>) -> DynamicObject {
    let mut value = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmControlPlane",
        "metadata": {"name": name},
        "spec": {
            "version": "1.36.3",
            "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtMachineTemplate", "name": "cp",
            }}},
        },
    });
    if let Some(replicas) = replicas {
        value["spec"]["replicas"] = json!(replicas);
    }
    object(value)
}

/// A MachineDeployment without rollout strategy, with a version without the leading `v`.
fn machine_deployment() -> DynamicObject {
    object(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {"name": "workers"},
        "spec": {
            "clusterName": "c1",
            "selector": {"matchLabels": {"pool": "workers"}},
            "template": {
                "metadata": {"labels": {"pool": "workers"}},
                "spec": {
                    "clusterName": "c1",
                    "version": "1.36.3",
                    "bootstrap": {"configRef": {
                        "apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfigTemplate", "name": "workers",
                    }},
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtMachineTemplate", "name": "workers",
                    },
                },
            },
        },
    }))
}

/// The message of an API error, or a failure naming what was unexpectedly accepted.
fn refusal(result: kube::Result<DynamicObject>, what: &str) -> Result<String> {
    match result {
        Err(kube::Error::Api(status)) => Ok(status.message),
        Err(other) => Err(other).with_context(|| format!("creating {what}")),
        Ok(created) => anyhow::bail!("{what} was accepted, expected a refusal by a webhook: {created:?}"),
    }
}

#[tokio::test]
async fn kubeadm_providers_serve_defaulting_and_validation_webhooks() -> Result<()> {
    let env = TestEnv::start().await?;
    let capi = env.start_capi(CapiOptions::new().with_kubeadm_providers()).await?;
    assert!(capi.has_kubeadm_providers());
    let namespace = env.unique_namespace("kubeadm").await?;
    let client = env.client();
    let context = || format!("managers' logs:\n{}", capi.log_tail(15));

    // KCP's defaulting webhook fills in what the user left out.
    let kcps = api(&client, &namespace, "controlplane.cluster.x-k8s.io", "KubeadmControlPlane", "kubeadmcontrolplanes");
    let created =
        kcps.create(&PostParams::default(), &kubeadm_control_plane("defaulted", None)).await.with_context(context)?;
    let spec = &created.data["spec"];
    assert_eq!(spec["version"], json!("v1.36.3"), "KCP's webhook prefixes the version with v: {spec}");
    assert_eq!(spec["replicas"], json!(1), "KCP's webhook defaults replicas to 1: {spec}");
    assert_eq!(spec["rollout"]["strategy"]["type"], json!("RollingUpdate"), "{spec}");
    assert_eq!(spec["rollout"]["strategy"]["rollingUpdate"]["maxSurge"], json!(1), "{spec}");

    // KCP's validating webhook refuses what the schema allows but KCP cannot do.
    let message = refusal(
        kcps.create(&PostParams::default(), &kubeadm_control_plane("even", Some(2))).await,
        "a KubeadmControlPlane with 2 replicas and stacked etcd",
    )?;
    assert!(message.contains("validation.kubeadmcontrolplane.controlplane.cluster.x-k8s.io"), "{message}");
    assert!(message.contains("cannot be an even number when etcd is stacked"), "{message}");

    // CABPK's validating webhook refuses a KubeadmConfig writing one path twice.
    let configs = api(&client, &namespace, "bootstrap.cluster.x-k8s.io", "KubeadmConfig", "kubeadmconfigs");
    let twice = object(json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfig",
        "metadata": {"name": "twice"},
        "spec": {"files": [
            {"path": "/etc/motd", "content": "one"},
            {"path": "/etc/motd", "content": "two"},
        ]},
    }));
    let message =
        refusal(configs.create(&PostParams::default(), &twice).await, "a KubeadmConfig writing /etc/motd twice")?;
    assert!(message.contains("validation.kubeadmconfig.bootstrap.cluster.x-k8s.io"), "{message}");
    assert!(message.contains("path property must be unique among all files"), "{message}");
    let valid = object(json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfig",
        "metadata": {"name": "once"},
        "spec": {"files": [{"path": "/etc/motd", "content": "one"}]},
    }));
    configs.create(&PostParams::default(), &valid).await.with_context(context)?;

    // The core manager's webhooks are served too: a MachineDeployment gets its rollout
    // defaults and the cluster-name label.
    let deployments = api(&client, &namespace, "cluster.x-k8s.io", "MachineDeployment", "machinedeployments");
    let created = deployments.create(&PostParams::default(), &machine_deployment()).await.with_context(context)?;
    let spec = &created.data["spec"];
    assert_eq!(spec["replicas"], json!(1), "{spec}");
    assert_eq!(spec["rollout"]["strategy"]["type"], json!("RollingUpdate"), "{spec}");
    assert_eq!(spec["rollout"]["strategy"]["rollingUpdate"]["maxSurge"], json!(1), "{spec}");
    assert_eq!(spec["rollout"]["strategy"]["rollingUpdate"]["maxUnavailable"], json!(0), "{spec}");
    assert_eq!(spec["template"]["spec"]["version"], json!("v1.36.3"), "{spec}");
    assert_eq!(
        created.metadata.labels.unwrap_or_default().get("cluster.x-k8s.io/cluster-name").map(String::as_str),
        Some("c1")
    );
    capi.ensure_running()?;

    // Stopping the managers unregisters their webhooks: the API server outlives them and
    // must not keep calling servers that are gone.
    let registered: Vec<String> = capi.webhook_configurations().into_iter().map(str::to_owned).collect();
    assert_eq!(registered.len(), 6, "mutating and validating configurations of 3 managers: {registered:?}");
    drop(capi);
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone()).list(&Default::default()).await?;
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone()).list(&Default::default()).await?;
    let left: Vec<String> = mutating
        .items
        .iter()
        .map(|c| &c.metadata)
        .chain(validating.items.iter().map(|c| &c.metadata))
        .filter_map(|m| m.name.clone())
        .filter(|name| registered.contains(name))
        .collect();
    assert!(left.is_empty(), "webhook configurations left after the managers stopped: {left:?}");
    // Without KCP's webhook the same object is stored as written (once the API server has
    // seen the deletion, which it learns through a watch).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let undefaulted = loop {
        match kcps.create(&PostParams::default(), &kubeadm_control_plane("undefaulted", None)).await {
            Err(kube::Error::Api(status))
                if status.message.contains("failed calling webhook") && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            result => break result?,
        }
    };
    assert_eq!(undefaulted.data["spec"]["version"], json!("1.36.3"));
    Ok(())
}

#[tokio::test]
async fn without_core_webhooks_objects_are_stored_as_written() -> Result<()> {
    let env = TestEnv::shared().await?;
    let capi = env.start_capi(CapiOptions::new().without_core_webhooks()).await?;
    assert!(!capi.has_kubeadm_providers());
    assert!(capi.webhook_configurations().is_empty());
    let namespace = env.unique_namespace("no-core-webhooks").await?;
    let deployments = api(&env.client(), &namespace, "cluster.x-k8s.io", "MachineDeployment", "machinedeployments");
    let created = deployments.create(&PostParams::default(), &machine_deployment()).await?;
    let spec = &created.data["spec"];
    assert_eq!(spec["template"]["spec"]["version"], json!("1.36.3"), "{spec}");
    assert!(spec["rollout"]["strategy"]["type"].is_null(), "no webhook defaulted the rollout: {spec}");
    capi.ensure_running()?;
    Ok(())
}
