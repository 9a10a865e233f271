//! A LibvirtMachine's addresses from IPAM pools (CAPI's IPAM contract): one
//! IPAddressClaim per pool in `spec.addressesFromPools`, owned by the
//! LibvirtMachine; the IPAddress an IPAM provider binds to it is the guest's
//! static address. Claims are deleted when the machine goes.

use std::net::IpAddr;

use capl_host::cloud_init::StaticAddress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::{Api, Resource, ResourceExt};

use super::context::Context;
use super::error::Error;
use crate::api::capi::CLUSTER_NAME_LABEL;
use crate::api::conditions::reasons;
use crate::api::ipam::{IPAddress, IPAddressClaim, IPAddressClaimSpec};
use crate::api::{LibvirtMachine, PoolReference};

const IPAM_GROUP: &str = "ipam.cluster.x-k8s.io";
/// The served (storage) version of the in-cluster IPAM provider's pools.
const IN_CLUSTER_POOL_VERSION: &str = "v1alpha2";

/// Where the machine's addresses stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed<T = Vec<StaticAddress>> {
    /// Every claim has its address.
    Ready(T),
    /// A claim has no address yet (or cannot get one): retried, and the
    /// claim's change brings a reconcile.
    Waiting { reason: &'static str, message: String },
    /// Something no retry fixes by itself (a claim of another owner at our
    /// name, an address IPAM wrote that is not one).
    Failed { reason: &'static str, message: String },
}

impl Claimed {
    /// The addresses, or what holds them up as a `Claimed` of another kind.
    fn ready<T>(self) -> Result<Vec<StaticAddress>, Claimed<T>> {
        match self {
            Claimed::Ready(found) => Ok(found),
            Claimed::Waiting { reason, message } => Err(Claimed::Waiting { reason, message }),
            Claimed::Failed { reason, message } => Err(Claimed::Failed { reason, message }),
        }
    }
}

/// The name of the machine's claim on its `index`-th pool.
pub fn claim_name(machine: &str, index: usize) -> String {
    format!("{machine}-{index}")
}

/// The object a claim belongs to: a LibvirtMachine (its addresses) or a
/// LibvirtCluster (its control-plane endpoint).
pub struct ClaimOwner {
    /// As messages name it, e.g. "LibvirtMachine m0".
    pub describe: String,
    pub reference: OwnerReference,
}

impl ClaimOwner {
    pub fn of<K: Resource<DynamicType = ()>>(object: &K) -> Self {
        let kind = K::kind(&()).to_string();
        let name = object.meta().name.clone().unwrap_or_default();
        Self {
            describe: format!("{kind} {name}"),
            reference: OwnerReference {
                api_version: K::api_version(&()).to_string(),
                kind,
                name,
                uid: object.meta().uid.clone().unwrap_or_default(),
                controller: Some(true),
                // Not set: under OwnerReferencesPermissionEnforcement that would
                // need update on the owner's finalizers, which the manager does not hold.
                block_owner_deletion: None,
            },
        }
    }
}

fn owned_by(claim: &IPAddressClaim, owner: &OwnerReference) -> bool {
    claim.owner_references().iter().any(|o| o.uid == owner.uid && o.kind == owner.kind)
}

/// The name of the machine's claim on the `index`-th pool of its `nic`-th
/// additional NIC (1 for the first of `spec.additionalNetworks`).
pub fn nic_claim_name(machine: &str, nic: usize, index: usize) -> String {
    format!("{machine}-nic{nic}-{index}")
}

/// Every claim of the machine, by name, with its pool: the first NIC's, then
/// each additional NIC's.
fn machine_claims(object: &LibvirtMachine) -> Vec<(String, PoolReference)> {
    let name = object.name_any();
    let first =
        object.spec.addresses_from_pools.iter().flatten().enumerate().map(|(i, p)| (claim_name(&name, i), p.clone()));
    let rest = object.spec.additional_networks.iter().flatten().enumerate().flat_map(|(n, nic)| {
        let name = name.clone();
        nic.addresses_from_pools
            .iter()
            .flatten()
            .enumerate()
            .map(move |(i, p)| (nic_claim_name(&name, n + 1, i), p.clone()))
    });
    first.chain(rest).collect()
}

/// Whether the machine takes any address from IPAM (on any NIC).
pub fn uses_ipam(object: &LibvirtMachine) -> bool {
    !machine_claims(object).is_empty()
}

/// The addresses of every NIC, once every claim has one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MachineAddresses {
    /// The first NIC's (`spec.addressesFromPools`).
    pub first: Vec<StaticAddress>,
    /// Each additional NIC's, in order (empty for a NIC that asks DHCP).
    pub additional: Vec<Vec<StaticAddress>>,
}

/// Makes sure each of the machine's claims exists (its first NIC's, then each
/// additional NIC's), and returns the addresses once all have one.
pub async fn claim(
    ctx: &Context,
    object: &LibvirtMachine,
    ns: &str,
    cluster: Option<&str>,
) -> Result<Claimed<MachineAddresses>, Error> {
    let owner = ClaimOwner::of(object);
    let name = object.name_any();
    let mut found = MachineAddresses::default();
    for (index, pool) in object.spec.addresses_from_pools.iter().flatten().enumerate() {
        match claim_one(ctx, ns, &owner, &claim_name(&name, index), pool, cluster).await?.ready() {
            Ok(mut a) => found.first.append(&mut a),
            Err(pending) => return Ok(pending),
        }
    }
    for (n, nic) in object.spec.additional_networks.iter().flatten().enumerate() {
        let mut addresses = Vec::new();
        for (index, pool) in nic.addresses_from_pools.iter().flatten().enumerate() {
            match claim_one(ctx, ns, &owner, &nic_claim_name(&name, n + 1, index), pool, cluster).await?.ready() {
                Ok(mut a) => addresses.append(&mut a),
                Err(pending) => return Ok(pending),
            }
        }
        found.additional.push(addresses);
    }
    Ok(Claimed::Ready(found))
}

/// Makes sure claim `name` of `owner` on `pool` exists; its address once it has one.
pub async fn claim_one(
    ctx: &Context,
    ns: &str,
    owner: &ClaimOwner,
    name: &str,
    pool: &PoolReference,
    cluster: Option<&str>,
) -> Result<Claimed, Error> {
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), ns);
    let addresses: Api<IPAddress> = Api::namespaced(ctx.client.clone(), ns);
    let who = &owner.describe;
    let pool_name = format!("{} {}", pool.kind, pool.name);
    let claim = match claims.get_opt(name).await? {
        Some(claim) => claim,
        None => {
            let mut claim = IPAddressClaim::new(
                name,
                IPAddressClaimSpec { pool_ref: pool.clone(), cluster_name: cluster.map(str::to_string) },
            );
            claim.metadata.owner_references = Some(vec![owner.reference.clone()]);
            if let Some(cluster) = cluster {
                claim.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_string(), cluster.to_string())].into());
            }
            match claims.create(&PostParams::default(), &claim).await {
                Ok(created) => created,
                // Made by a reconcile a moment ago: read it back.
                Err(kube::Error::Api(e)) if e.code == 409 => claims.get(name).await?,
                Err(e) => return Err(e.into()),
            }
        }
    };
    if !owned_by(&claim, &owner.reference) {
        return Ok(Claimed::Failed {
            reason: reasons::OBJECT_COLLISION,
            message: format!(
                "{who}: IPAddressClaim {ns}/{name} exists and is not this object's: delete or rename it so that an address can be claimed from {pool_name}"
            ),
        });
    }
    if claim.spec.pool_ref != *pool {
        return Ok(Claimed::Failed {
            reason: reasons::OBJECT_COLLISION,
            message: format!(
                "{who}: IPAddressClaim {ns}/{name} claims from {} {}, not from {pool_name}: delete the claim",
                claim.spec.pool_ref.kind, claim.spec.pool_ref.name
            ),
        });
    }
    let bound = claim.status.as_ref().and_then(|s| s.address_ref.as_ref()).map(|r| r.name.clone());
    let address = match bound.filter(|n| !n.is_empty()) {
        Some(address) => addresses.get_opt(&address).await?,
        None => None,
    };
    let Some(address) = address else {
        if let Some((reason, why)) = pool_problem(ctx, ns, pool).await {
            let message = format!("{who}: IPAddressClaim {name} has no address: {why}");
            return Ok(Claimed::Waiting { reason, message });
        }
        return Ok(Claimed::Waiting {
            reason: reasons::WAITING_FOR_IP_ADDRESS,
            message: waiting(who, name, &pool_name, &claim),
        });
    };
    Ok(match static_address(&address) {
        Ok(a) => Claimed::Ready(vec![a]),
        Err(why) => Claimed::Failed {
            reason: reasons::INVALID_IP_ADDRESS,
            message: format!("{who}: IPAddress {ns}/{} from {pool_name}: {why}", address.name_any()),
        },
    })
}

/// Why claim `name` has no address: the IPAM provider's own word when it gave one.
fn waiting(who: &str, name: &str, pool: &str, claim: &IPAddressClaim) -> String {
    let said = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "False"));
    match said {
        Some(c) => format!(
            "{who}: IPAddressClaim {name} has no address from {pool}: {} ({}); fix the pool (or free addresses in it)",
            c.message, c.reason
        ),
        None => format!(
            "{who}: waiting for IPAddressClaim {name} to get an address from {pool}: check that the pool exists and that an IPAM provider for its kind is installed"
        ),
    }
}

/// The pool kinds of the in-cluster IPAM provider, whose status says how many
/// addresses are free: (kind, plural, namespaced).
const IN_CLUSTER_POOLS: &[(&str, &str, bool)] =
    &[("InClusterIPPool", "inclusterippools", true), ("GlobalInClusterIPPool", "globalinclusterippools", false)];

/// Why a pool of the in-cluster IPAM provider gives no address: it does not
/// exist, or it has no free address (that provider writes neither on the
/// claim). `None` for other pools, or when the pool cannot be read.
async fn pool_problem(ctx: &Context, ns: &str, pool: &PoolReference) -> Option<(&'static str, String)> {
    if pool.api_group != IPAM_GROUP {
        return None;
    }
    let (kind, plural, namespaced) = IN_CLUSTER_POOLS.iter().find(|(kind, _, _)| *kind == pool.kind)?;
    let resource = ApiResource {
        group: IPAM_GROUP.to_string(),
        version: IN_CLUSTER_POOL_VERSION.to_string(),
        api_version: format!("{IPAM_GROUP}/{IN_CLUSTER_POOL_VERSION}"),
        kind: kind.to_string(),
        plural: plural.to_string(),
    };
    let api: Api<DynamicObject> = if *namespaced {
        Api::namespaced_with(ctx.client.clone(), ns, &resource)
    } else {
        Api::all_with(ctx.client.clone(), &resource)
    };
    let place = if *namespaced { format!(" in namespace {ns}") } else { String::new() };
    match api.get_opt(&pool.name).await {
        Ok(None) => Some((
            reasons::IP_ADDRESS_POOL_NOT_FOUND,
            format!(
                "{kind} {}{place} does not exist: create it, or name an existing pool in spec.addressesFromPools",
                pool.name
            ),
        )),
        Ok(Some(found)) => {
            let counts = &found.data["status"]["ipAddresses"];
            let (free, total) = (counts["free"].as_i64()?, counts["total"].as_i64().unwrap_or_default());
            (free == 0).then(|| {
                (
                    reasons::IP_ADDRESS_POOL_EXHAUSTED,
                    format!(
                        "{kind} {}{place} has no free address ({total} of {total} in use): add addresses to the pool or delete machines that hold them",
                        pool.name
                    ),
                )
            })
        }
        // No such resource at all (a plain 404, not a Status): the kind is not installed.
        Err(kube::Error::Api(e)) if e.code == 404 => Some((
            reasons::IP_ADDRESS_POOL_NOT_FOUND,
            format!(
                "{kind} {}{place} cannot exist: the API server does not serve {kind} ({IPAM_GROUP}/{IN_CLUSTER_POOL_VERSION}); install the in-cluster IPAM provider, or name a pool of an installed IPAM provider in spec.addressesFromPools",
                pool.name
            ),
        )),
        Err(err) => {
            tracing::debug!(pool = %pool.name, %err, "cannot read the IPAM pool");
            None
        }
    }
}

/// The address, prefix and gateway of an IPAddress, checked.
pub fn static_address(address: &IPAddress) -> Result<StaticAddress, String> {
    let ip: IpAddr =
        address.spec.address.parse().map_err(|_| format!("{:?} is not an IP address", address.spec.address))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if address.spec.prefix < 0 || address.spec.prefix > max {
        return Err(format!("prefix {} is not a prefix length of {ip}", address.spec.prefix));
    }
    let gateway = match address.spec.gateway.as_deref().filter(|g| !g.is_empty()) {
        Some(g) => Some(g.parse::<IpAddr>().map_err(|_| format!("gateway {g:?} is not an IP address"))?),
        None => None,
    };
    Ok(StaticAddress { address: ip, prefix: address.spec.prefix as u8, gateway })
}

/// Deletes the machine's claims (those that are its own); the IPAM provider
/// then releases their addresses.
pub async fn release(ctx: &Context, object: &LibvirtMachine, ns: &str) -> Result<(), Error> {
    let owner = ClaimOwner::of(object);
    for (name, _) in machine_claims(object) {
        release_one(ctx, ns, &owner, &name).await?;
    }
    Ok(())
}

/// Deletes claim `name` when it is `owner`'s.
pub async fn release_one(ctx: &Context, ns: &str, owner: &ClaimOwner, name: &str) -> Result<(), Error> {
    let claims: Api<IPAddressClaim> = Api::namespaced(ctx.client.clone(), ns);
    if let Some(claim) = claims.get_opt(name).await?
        && owned_by(&claim, &owner.reference)
    {
        match claims.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
