//! CAPI's in-cluster IPAM provider (`sigs.k8s.io/cluster-api-ipam-provider-in-cluster`) runs
//! beside the CAPI core manager against the real kube-apiserver: an IPAddressClaim on an
//! InClusterIPPool gets an IPAddress from the pool (validated by CAPI core's webhooks), a
//! claim on an exhausted pool gets none, and deleting a claim releases its address, which the
//! waiting claim then gets.
//!
//! Needs `cargo xtask control-plane build` (it builds `capi-ipam-in-cluster-manager` and
//! copies the provider's pool CRDs besides CAPI's managers and CRDs).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use testenv::{CapiManager, CapiOptions, TestEnv};

const IPAM_GROUP: &str = "ipam.cluster.x-k8s.io";
/// The served (and storage) version of the provider's pools; v1alpha1 is served too.
const POOL_VERSION: &str = "v1alpha2";
/// The storage version of CAPI core's IPAddressClaim and IPAddress (v1alpha1 and v1beta1
/// are served too).
const CLAIM_VERSION: &str = "v1beta2";
/// The finalizer the provider puts on every claim it reconciles (`ipamutil.ReleaseAddressFinalizer`).
const RELEASE_ADDRESS_FINALIZER: &str = "ipam.cluster.x-k8s.io/ReleaseAddress";
/// What the provider reports when a pool has no free address: v1.1.0 sets no condition on
/// the claim (it writes no status conditions at all); its claim reconciler returns this error
/// (`poolutil.FindFreeAddress`, wrapped by `EnsureAddress` and `ClaimReconciler.Reconcile`),
/// which controller-runtime logs as "Reconciler error" and retries with backoff.
const EXHAUSTED_ERROR: &str = "failed to create or patch address: failed to find free address: no address available";
/// Every wait of this test.
const WAIT: Duration = Duration::from_secs(90);

fn api(client: &Client, namespace: &str, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(IPAM_GROUP, version, kind);
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, plural))
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a test object is a valid DynamicObject")
}

fn claim(name: &str, pool: &str) -> DynamicObject {
    object(json!({
        "apiVersion": format!("{IPAM_GROUP}/{CLAIM_VERSION}"),
        "kind": "IPAddressClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": pool}},
    }))
}

/// The name in `status.addressRef`, once the provider has allocated an address.
fn address_ref(claim: &DynamicObject) -> Option<&str> {
    claim.data["status"]["addressRef"]["name"].as_str().filter(|name| !name.is_empty())
}

/// Polls `check` until it yields a value, for at most [`WAIT`]; the error names `what` and
/// ends with the managers' logs.
async fn wait_for<T, F, Fut>(capi: &CapiManager, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        capi.ensure_running()?;
        let last = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => String::from("not yet"),
            Err(err) => format!("{err:#}"),
        };
        if Instant::now() > deadline {
            bail!("{what}: not within {WAIT:?} (last: {last}); managers' logs:\n{}", capi.log_tail(30));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The claim once its `status.addressRef` is set, and the IPAddress it names.
async fn wait_for_address(
    capi: &CapiManager,
    claims: &Api<DynamicObject>,
    addresses: &Api<DynamicObject>,
    name: &str,
) -> Result<DynamicObject> {
    let address = wait_for(capi, &format!("IPAddressClaim {name} gets status.addressRef"), || async {
        Ok(claims.get(name).await?.data["status"]["addressRef"]["name"].as_str().map(str::to_owned))
    })
    .await?;
    addresses.get(&address).await.with_context(|| format!("reading IPAddress {address} of claim {name}"))
}

/// Asserts an IPAddress's spec: allocated from `pool` for `claim`, with the pool's prefix and gateway.
fn assert_address(address: &DynamicObject, claim: &str, pool: &str, expected: &str) {
    let spec = &address.data["spec"];
    assert_eq!(spec["address"], json!(expected), "{spec}");
    assert_eq!(spec["prefix"], json!(24), "{spec}");
    assert_eq!(spec["gateway"], json!("10.77.0.1"), "{spec}");
    assert_eq!(spec["claimRef"]["name"], json!(claim), "{spec}");
    assert_eq!(spec["poolRef"], json!({"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": pool}), "{spec}");
}

/// Whether the IPAM manager's log has a line reporting [`EXHAUSTED_ERROR`] for claim
/// `namespace/name`.
fn logged_exhaustion(log: &Path, namespace: &str, name: &str) -> Result<bool> {
    let text = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let claim = format!("IPAddressClaim=\"{namespace}/{name}\"");
    Ok(text.lines().any(|line| line.contains(EXHAUSTED_ERROR) && line.contains(&claim)))
}

#[tokio::test]
async fn in_cluster_ipam_allocates_addresses_until_the_pool_is_exhausted() -> Result<()> {
    let env = TestEnv::start().await?;
    let capi = env.start_capi(CapiOptions::new().with_ipam_in_cluster()).await?;
    assert!(capi.has_ipam_in_cluster());
    // Only the core manager's webhooks: the IPAM provider runs with --webhook-port=0.
    let registered = capi.webhook_configurations();
    assert_eq!(registered.len(), 2, "the core manager's mutating and validating configurations: {registered:?}");
    assert!(registered.iter().all(|name| !name.contains("ipam-in-cluster")), "{registered:?}");
    let ipam_log = capi
        .log_paths()
        .into_iter()
        .find(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("capi-ipam-in-cluster")))
        .context("the IPAM manager's log")?
        .to_owned();

    let namespace = env.unique_namespace("ipam").await?;
    let client = env.client();
    let pools = api(&client, &namespace, POOL_VERSION, "InClusterIPPool", "inclusterippools");
    let claims = api(&client, &namespace, CLAIM_VERSION, "IPAddressClaim", "ipaddressclaims");
    let addresses = api(&client, &namespace, CLAIM_VERSION, "IPAddress", "ipaddresses");

    // Two addresses; the gateway is outside the range.
    let pool = object(json!({
        "apiVersion": format!("{IPAM_GROUP}/{POOL_VERSION}"),
        "kind": "InClusterIPPool",
        "metadata": {"name": "two"},
        "spec": {"addresses": ["10.77.0.10-10.77.0.11"], "prefix": 24, "gateway": "10.77.0.1"},
    }));
    pools.create(&PostParams::default(), &pool).await.context("creating the InClusterIPPool")?;

    claims.create(&PostParams::default(), &claim("first", "two")).await.context("creating claim first")?;
    let first = wait_for_address(&capi, &claims, &addresses, "first").await?;
    assert_eq!(first.metadata.name.as_deref(), Some("first"), "the IPAddress is named after its claim");
    assert_address(&first, "first", "two", "10.77.0.10");

    claims.create(&PostParams::default(), &claim("second", "two")).await.context("creating claim second")?;
    let second = wait_for_address(&capi, &claims, &addresses, "second").await?;
    assert_address(&second, "second", "two", "10.77.0.11");

    // The pool reports what is left.
    wait_for(&capi, "InClusterIPPool two reports 2 used, 0 free", || async {
        let status = pools.get("two").await?.data["status"]["ipAddresses"].clone();
        Ok((status == json!({"total": 2, "used": 2, "free": 0, "outOfRange": 0})).then_some(()))
    })
    .await?;

    // A third claim: the provider takes it (its finalizer) but finds no free address.
    claims.create(&PostParams::default(), &claim("third", "two")).await.context("creating claim third")?;
    wait_for(&capi, "the IPAM provider reports pool two exhausted for claim third", || async {
        Ok(logged_exhaustion(&ipam_log, &namespace, "third")?.then_some(()))
    })
    .await?;
    let third = claims.get("third").await?;
    assert!(
        third.metadata.finalizers.iter().flatten().any(|f| f == RELEASE_ADDRESS_FINALIZER),
        "the provider reconciled claim third: {third:?}"
    );
    assert_eq!(address_ref(&third), None, "an exhausted pool allocates nothing: {third:?}");
    assert!(
        third.data["status"]["conditions"].as_array().is_none_or(Vec::is_empty),
        "v1.1.0 writes no condition on a claim (if a newer version does, assert on it here): {third:?}"
    );
    assert!(addresses.get_opt("third").await?.is_none(), "no IPAddress for claim third");

    // Deleting a claim releases its address: the provider deletes the IPAddress (no garbage
    // collector runs here), then lets the claim go.
    claims.delete("first", &DeleteParams::default()).await.context("deleting claim first")?;
    wait_for(&capi, "claim first and its IPAddress are deleted", || async {
        let gone = claims.get_opt("first").await?.is_none() && addresses.get_opt("first").await?.is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    // The waiting claim gets the freed address.
    let third = wait_for_address(&capi, &claims, &addresses, "third").await?;
    assert_address(&third, "third", "two", "10.77.0.10");
    capi.ensure_running()?;
    Ok(())
}
