//! The `init` scenario: the real `clusterctl init` into a fresh management
//! cluster, offline.
//!
//! A new local API server (etcd + kube-apiserver, nothing of CAPI) gets
//! `clusterctl init --core cluster-api:<CAPI> --bootstrap kubeadm:<CAPI>
//! --control-plane kubeadm:<CAPI> --infrastructure libvirt:<release>` with a
//! clusterctl.yaml whose providers all come from this machine:
//! - this provider's release, written by `capl-manifests release` (the layout
//!   of `cargo xtask release`) and named by the URL a user writes for a
//!   GitHub release (`https://github.com/<owner>/cluster-api-provider-libvirt/releases/latest/infrastructure-components.yaml`),
//!   which [`crate::harness::github_release`] serves on 127.0.0.1 the way
//!   GitHub and the Go module proxy do: clusterctl's GitHub client lists the
//!   versions and downloads every file through it;
//! - CAPI core and the kubeadm providers, built from the pinned CAPI module by
//!   `cargo xtask control-plane build` as CAPI's `make release-manifests` does
//!   (`kustomize build <provider>/config/default` with the release image,
//!   plus the module's `metadata.yaml`).
//!
//! clusterctl installs cert-manager itself only when the cert-manager API is
//! not served; it checks by creating an Issuer and a Certificate
//! (`cert-manager.io/v1`) in a namespace `cert-manager-test` and deleting
//! them. cert-manager's release (`cert-manager.yaml`) is only on GitHub, and
//! its pods could not run here anyway (no kubelet), so the API server gets
//! cert-manager's CRDs of the version clusterctl would install (from its Go
//! module), and clusterctl.yaml declares cert-manager externally provisioned:
//! clusterctl then runs only that check, bounded by its `timeout`.
//!
//! No Pod runs (no kubelet), so the scenario does not pass `--wait-providers`:
//! what is checked is what clusterctl writes, as a user would look at it: the
//! exit status, the inventory (one Provider object per provider, with its
//! version), every object of each provider's components (as `clusterctl
//! generate provider` renders them) present with clusterctl's two labels, the
//! component variables substituted with their defaults in the Deployments,
//! and `clusterctl upgrade plan` reading the inventory back.
//!
//! Only one `clusterctl init` can run against such an API server: its
//! cert-manager check deletes the namespace `cert-manager-test`, which stays
//! Terminating because no namespace controller (kube-controller-manager)
//! runs here, so a second `init` (to add a provider) fails that check
//! (`Error: context deadline exceeded` after the cert-manager timeout).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::discovery::{self, Scope};
use serde_json::Value;
use testenv::TestEnv;
use testenv::control_plane_versions::{CAPI_RELEASE_PROVIDERS, CAPI_RELEASE_REGISTRY, CAPI_VERSION};

use crate::harness::clusterctl::{CLUSTERCTL_LABEL, INFRA_PROVIDER, LocalRepository, PROVIDER_LABEL};
use crate::harness::github_release::GithubRelease;
use crate::harness::progress::say;
use crate::harness::stack::Stack;

/// The release `clusterctl init` installs.
const RELEASE_VERSION: &str = "v0.1.0";
/// The GitHub owner the release is served under.
const RELEASE_OWNER: &str = "capl-e2e";
/// What clusterctl logs when the cert-manager API answers (cert_manager.go).
const CERT_MANAGER_PRESENT: &str = "Skipping installing cert-manager as it is already installed";
/// The namespace of this provider's components.
const INFRA_NAMESPACE: &str = "capl-system";
/// The Deployment of this provider's components.
const INFRA_DEPLOYMENT: &str = "capl-controller-manager";
/// The defaults of the release's variables, as they must appear in the Deployment's args
/// (the table of the book's getting-started page): `${CAPL_WATCH_NAMESPACE:=*}`, `${CAPL_CONCURRENCY:=10}`,
/// `${CAPL_LOG_FORMAT:=json}`.
const INFRA_DEFAULT_ARGS: &[(&str, &str)] = &[
    ("CAPL_WATCH_NAMESPACE", "--namespace=*"),
    ("CAPL_CONCURRENCY", "--concurrency=10"),
    ("CAPL_LOG_FORMAT", "--log-format=json"),
];

/// One provider as the scenario expects clusterctl to install it.
struct Expected {
    /// The `clusterctl init` / `generate provider` flag.
    flag: &'static str,
    /// clusterctl's name of the provider (`cluster-api`, `kubeadm`, `libvirt`).
    name: &'static str,
    type_: &'static str,
    /// The Provider object's name and the `cluster.x-k8s.io/provider` label.
    label: &'static str,
    namespace: &'static str,
    version: String,
}

impl Expected {
    /// The provider as the command line names it: CAPI's at their version;
    /// this provider by name alone, as a user installs the latest release,
    /// which clusterctl resolves from the release URL's version list.
    fn spec(&self) -> String {
        if self.flag == "--infrastructure" { self.name.to_string() } else { format!("{}:{}", self.name, self.version) }
    }
}

fn expected_providers() -> Vec<Expected> {
    let mut providers: Vec<Expected> = CAPI_RELEASE_PROVIDERS
        .iter()
        .map(|p| Expected {
            flag: match p.type_ {
                "CoreProvider" => "--core",
                "BootstrapProvider" => "--bootstrap",
                _ => "--control-plane",
            },
            name: p.name,
            type_: p.type_,
            label: p.label,
            namespace: p.namespace,
            version: CAPI_VERSION.to_string(),
        })
        .collect();
    providers.push(Expected {
        flag: "--infrastructure",
        name: "libvirt",
        type_: "InfrastructureProvider",
        label: INFRA_PROVIDER,
        namespace: INFRA_NAMESPACE,
        version: RELEASE_VERSION.to_string(),
    });
    providers
}

pub async fn clusterctl_init(stack: &mut Stack) -> Result<String> {
    init_fresh_cluster(&stack.work_dir.join("init")).await
}

/// Runs the scenario in `dir` (the local repository and clusterctl's
/// configuration live there); returns the one-line observation.
pub async fn init_fresh_cluster(dir: &Path) -> Result<String> {
    let id = "init";
    let started = Instant::now();
    let assets = testenv::Assets::locate()?;
    let repository = LocalRepository::release(&dir.join("clusterctl-repository"), RELEASE_VERSION)?;
    let github = GithubRelease::serve(&repository.releases(), RELEASE_OWNER, dir)?;
    let repository =
        repository.served_at(github.components_url(), github.clusterctl_env())?.with_capi_release(&assets)?;
    say(id, format!("the release served as {}", github.components_url()));
    let env = TestEnv::start().await.context("starting a fresh API server for clusterctl init")?;
    let client = env.client();

    // A fresh management cluster: no CAPI, no inventory, no provider.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let before: Vec<String> = crds
        .list(&ListParams::default())
        .await
        .context("listing CRDs")?
        .items
        .iter()
        .filter_map(|crd| crd.metadata.name.clone())
        .collect();
    ensure!(before.is_empty(), "the fresh API server already has CRDs: {before:?}");
    let cert_manager =
        env.install_crds_from_dir(&assets.cert_manager_crds_dir()?).await.context("installing cert-manager's CRDs")?;
    say(id, format!("fresh API server with cert-manager's {} CRDs in {:.1} s", cert_manager.len(), secs(started)));

    // The real `clusterctl init`.
    let providers = expected_providers();
    let kubeconfig = env.kubeconfig_path().display().to_string();
    let specs: Vec<String> = providers.iter().map(Expected::spec).collect();
    let mut args = vec!["init", "--kubeconfig", &kubeconfig];
    for (provider, spec) in providers.iter().zip(&specs) {
        args.extend([provider.flag, spec.as_str()]);
    }
    let init_started = Instant::now();
    let output = repository.clusterctl_output(&args)?;
    let init_seconds = secs(init_started);
    say(id, format!("clusterctl {} exited 0 in {init_seconds:.1} s", args.join(" ")));
    let log = format!("{}{}", output.stderr, output.stdout);
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        say(id, format!("  clusterctl: {line}"));
    }
    ensure!(
        log.contains(CERT_MANAGER_PRESENT),
        "clusterctl did not take cert-manager as installed (no {CERT_MANAGER_PRESENT:?}):\n{log}"
    );
    for provider in &providers {
        let installing = format!("Installing provider=\"{}\" version=\"{}\"", provider.label, provider.version);
        ensure!(log.contains(&installing), "clusterctl's log does not say {installing:?}:\n{log}");
    }

    check_inventory(&client, &providers).await?;
    // The release's files came from its GitHub release URL.
    let served = github.requests();
    for file in ["metadata.yaml", "infrastructure-components.yaml"] {
        let asset = format!(
            "github.com/{RELEASE_OWNER}/{}/releases/download/{RELEASE_VERSION}/{file} 200",
            crate::harness::github_release::REPOSITORY
        );
        ensure!(served.contains(&asset), "clusterctl did not download {file} from the release URL; served: {served:?}");
    }
    say(id, format!("clusterctl took the release from its URL: {} requests, {}", served.len(), served.join(", ")));

    // Every object of every provider's components, as clusterctl renders them.
    let mut resources = HashMap::new();
    let mut checked = 0;
    for provider in &providers {
        let components = repository.generated_provider(provider.flag, &provider.spec())?;
        ensure!(!components.is_empty(), "clusterctl generate provider {} rendered nothing", provider.spec());
        for object in &components {
            check_applied(&client, &mut resources, object, provider).await?;
            checked += 1;
        }
    }
    say(id, format!("{checked} objects of 4 providers applied with clusterctl's labels"));

    check_deployments(&client, &repository).await?;

    // clusterctl itself reads the inventory back: every provider at the newest
    // version of its (local) repository.
    let plan = repository.clusterctl(&["upgrade", "plan", "--kubeconfig", &kubeconfig])?;
    for provider in &providers {
        let row = plan.lines().find(|line| line.split_whitespace().next() == Some(provider.label));
        let columns: Vec<&str> = row.map(|r| r.split_whitespace().collect()).unwrap_or_default();
        ensure!(
            columns.len() >= 4
                && columns[1] == provider.namespace
                && columns[2] == provider.type_
                && columns[3] == provider.version
                && row.is_some_and(|r| r.ends_with("Already up to date")),
            "clusterctl upgrade plan does not list {} {} in {} as up to date:\n{plan}",
            provider.label,
            provider.version,
            provider.namespace
        );
    }
    ensure!(plan.contains("You are already up to date!"), "clusterctl upgrade plan:\n{plan}");
    let listed =
        format!("goproxy/github.com/{RELEASE_OWNER}/{}/@v/list 200", crate::harness::github_release::REPOSITORY);
    ensure!(
        github.requests().contains(&listed),
        "clusterctl did not list the release's versions: {:?}",
        github.requests()
    );
    say(id, "clusterctl upgrade plan: every provider already up to date");

    let total = secs(started);
    say(id, format!("done in {total:.1} s"));
    drop(env);
    Ok(format!(
        "clusterctl init installed {} into a fresh API server in {init_seconds:.0} s ({checked} objects, inventory, \
         variable defaults, upgrade plan up to date); {total:.0} s in all",
        specs.join(", ")
    ))
}

/// The inventory: exactly one Provider object per provider, in its namespace,
/// with clusterctl's name, type and version.
async fn check_inventory(client: &Client, providers: &[Expected]) -> Result<()> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider"),
        "providers",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let listed = api.list(&ListParams::default()).await.context("listing clusterctl's Provider objects")?;
    let found: BTreeMap<String, (String, String, String, String)> = listed
        .items
        .iter()
        .map(|p| {
            let field = |name: &str| p.data[name].as_str().unwrap_or_default().to_string();
            (
                p.metadata.name.clone().unwrap_or_default(),
                (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    field("providerName"),
                    field("type"),
                    field("version"),
                ),
            )
        })
        .collect();
    let wanted: BTreeMap<String, (String, String, String, String)> = providers
        .iter()
        .map(|p| {
            (p.label.to_string(), (p.namespace.to_string(), p.name.to_string(), p.type_.to_string(), p.version.clone()))
        })
        .collect();
    ensure!(
        found == wanted,
        "clusterctl's inventory (name: namespace, providerName, type, version) is {found:?}, expected {wanted:?}"
    );
    Ok(())
}

/// `object` (one document of `clusterctl generate provider`) exists in the
/// cluster and carries clusterctl's labels for `provider`.
async fn check_applied(
    client: &Client,
    resources: &mut HashMap<String, (ApiResource, bool)>,
    object: &Value,
    provider: &Expected,
) -> Result<()> {
    let api_version = object["apiVersion"].as_str().context("a component without apiVersion")?;
    let kind = object["kind"].as_str().context("a component without kind")?;
    let name = object["metadata"]["name"].as_str().context("a component without a name")?;
    let key = format!("{api_version}/{kind}");
    if !resources.contains_key(&key) {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let (resource, capabilities) = discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
            .await
            .with_context(|| format!("the API server does not serve {key} (of {})", provider.label))?;
        resources.insert(key.clone(), (resource, capabilities.scope == Scope::Namespaced));
    }
    let (resource, namespaced) = &resources[&key];
    let api: Api<DynamicObject> = if *namespaced {
        let ns = object["metadata"]["namespace"].as_str().unwrap_or(provider.namespace);
        Api::namespaced_with(client.clone(), ns, resource)
    } else {
        Api::all_with(client.clone(), resource)
    };
    let Some(applied) = api.get_opt(name).await.with_context(|| format!("reading {kind} {name}"))? else {
        bail!("clusterctl init did not apply {kind} {name} of {}", provider.label);
    };
    let labels = applied.metadata.labels.unwrap_or_default();
    ensure!(
        labels.get(CLUSTERCTL_LABEL).map(String::as_str) == Some("")
            && labels.get(PROVIDER_LABEL).map(String::as_str) == Some(provider.label),
        "{kind} {name} of {} lacks clusterctl's labels ({CLUSTERCTL_LABEL}=\"\", {PROVIDER_LABEL}={}): {labels:?}",
        provider.label,
        provider.label
    );
    Ok(())
}

/// The managers' Deployments as applied: the release images, and every
/// `${VAR:=default}` of the components files replaced by its default.
async fn check_deployments(client: &Client, repository: &LocalRepository) -> Result<()> {
    let raw = std::fs::read_to_string(repository.components())?;
    for (variable, _) in INFRA_DEFAULT_ARGS {
        ensure!(raw.contains(&format!("${{{variable}:=")), "the release's components no longer use ${{{variable}}}");
    }
    let ours = container(client, INFRA_NAMESPACE, INFRA_DEPLOYMENT).await?;
    let image = format!("registry.example/cluster-api-provider-libvirt:{RELEASE_VERSION}");
    ensure!(ours.0 == image, "{INFRA_DEPLOYMENT} runs {}, the release's image is {image}", ours.0);
    for (variable, arg) in INFRA_DEFAULT_ARGS {
        ensure!(
            ours.1.iter().any(|a| a == arg),
            "{INFRA_DEPLOYMENT}: no {arg} (default of {variable}) in {:?}",
            ours.1
        );
    }
    for provider in CAPI_RELEASE_PROVIDERS {
        let deployment = format!("{}-controller-manager", provider.namespace.trim_end_matches("-system"));
        let (image, args) = container(client, provider.namespace, &deployment).await?;
        let release_image = format!("{CAPI_RELEASE_REGISTRY}/{}:{CAPI_VERSION}", provider.image);
        ensure!(image == release_image, "{deployment} runs {image}, CAPI's release image is {release_image}");
        // `--feature-gates=MachinePool=${EXP_MACHINE_POOL:=true},...` in the components file.
        ensure!(
            args.iter().any(|a| a.starts_with("--feature-gates=MachinePool=true,"))
                && !args.iter().any(|a| a.contains("${")),
            "{deployment}'s args are not substituted with the defaults: {args:?}"
        );
    }
    Ok(())
}

/// The image and args of the `manager` container of Deployment `ns/name`.
async fn container(client: &Client, ns: &str, name: &str) -> Result<(String, Vec<String>)> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?
        .with_context(|| format!("clusterctl init applied no Deployment {ns}/{name}"))?;
    let manager = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().find(|c| c.name == "manager"))
        .with_context(|| format!("Deployment {ns}/{name} has no manager container"))?;
    Ok((manager.image.unwrap_or_default(), manager.args.unwrap_or_default()))
}

fn secs(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}
