//! Every object of every template is accepted by a real kube-apiserver that
//! has CAPI's CRDs (core, kubeadm bootstrap, kubeadm control plane) and ours
//! installed: server-side apply, dry run, strict field validation. This
//! catches a misspelt or misplaced v1beta2 field, which parsing alone cannot.

#[path = "support/clusterctl_template.rs"]
mod clusterctl_template;

use clusterctl_template::{parse_documents, repo_root, substitute, template_files};
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Scope, pinned_kind};
use kube::Api;

#[tokio::test]
async fn every_template_object_is_accepted_by_the_api_server() {
    let env = testenv::TestEnv::shared().await.expect("local control plane (run `cargo xtask control-plane build`)");
    env.install_capi_crds().await.unwrap();
    env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await.unwrap();
    let namespace = env.unique_namespace("templates").await.unwrap();
    let client = env.client();

    let mut checked = 0;
    for path in template_files() {
        let origin = path.file_name().unwrap().to_string_lossy().to_string();
        let (text, _) = substitute(&std::fs::read_to_string(&path).unwrap());
        for mut doc in parse_documents(&text) {
            let api_version = doc["apiVersion"].as_str().unwrap().to_string();
            let kind = doc["kind"].as_str().unwrap().to_string();
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
            let gvk = GroupVersionKind::gvk(group, version, &kind);
            let (resource, caps) = pinned_kind(&client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{origin}: the API server does not serve {api_version} {kind}: {e}"));
            assert_eq!(caps.scope, Scope::Namespaced, "{origin}: {kind}");
            doc["metadata"]["namespace"] = namespace.clone().into();
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
            let params = PatchParams::apply("template-test").dry_run().validation_strict();
            api.patch(&name, &params, &Patch::Apply(&doc))
                .await
                .unwrap_or_else(|e| panic!("{origin}: {kind} {name} is rejected by the API server: {e}"));
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} objects checked");

    // The check has teeth: a field the schema does not know is refused.
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster");
    let (resource, _) = pinned_kind(&client, &gvk).await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let bogus = serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "bogus", "namespace": namespace},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtCluster", "name": "x"}, "controlPlaneReference": {}}
    });
    let params = PatchParams::apply("template-test").dry_run().validation_strict();
    let err = api.patch("bogus", &params, &Patch::Apply(&bogus)).await.unwrap_err();
    assert!(err.to_string().contains("controlPlaneReference"), "{err}");
}
