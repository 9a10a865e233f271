//! The cloud-init NoCloud seed ISO: a raw volume in domainPool holding the
//! bootstrap data as user-data, written before the domain is defined.

use crate::cloud_init::{
    VOLUME_LABEL, iso_volume_label, meta_data, network_config_for, nocloud_iso, nocloud_iso_with_network,
    seed_instance_id,
};
use crate::domain_xml::DomainInfo;
use crate::error::{HostResult, ObjectKind};
use crate::volume_xml::VolumeInfo;

use super::{LeftOnHost, MachineRun};

/// Whose a seed volume is ([`MachineRun::seed_identity`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SeedIdentity {
    /// Zeros: created, never written.
    Empty,
    /// A seed written for the machine with this identity.
    Of(String),
}

/// The largest cloud-init ISO the provider creates (a Secret holds at most 1 MiB).
pub const MAX_SEED_BYTES: u64 = 4 * 1024 * 1024;

impl MachineRun<'_> {
    /// The seed: user-data, meta-data, and a network-config when the guest
    /// has static addresses or more than one NIC (cloud-init then configures
    /// exactly the NICs it lists, so the first one is listed with DHCP and the
    /// MAC it reserves its address with).
    pub(super) fn seed_bytes(&mut self, user_data: &[u8]) -> HostResult<Vec<u8>> {
        let meta = meta_data(self.names.instance_id(), self.names.hostname());
        if !self.spec.is_static() && self.spec.additional_nics.is_empty() {
            return Ok(nocloud_iso(user_data, meta.as_bytes()));
        }
        let network = network_config_for(&self.guest_interfaces()?, &self.spec.nameservers);
        Ok(nocloud_iso_with_network(user_data, meta.as_bytes(), Some(network.as_bytes())))
    }

    pub(super) fn ensure_seed_volume(&mut self, user_data: &[u8]) -> HostResult<()> {
        let size = self.seed_bytes(user_data)?.len() as u64;
        let name = self.names.cloud_init_volume();
        let volume =
            self.ensure_sized_volume(&self.spec.domain_pool, &name, size, |found| self.check_seed_is_ours(found))?;
        self.seed_path = Some(volume.path);
        Ok(())
    }

    /// Writes the seed into its volume. Always rewritten while the domain is
    /// not yet defined: a crash between creating the volume and uploading
    /// leaves it empty, and the upload is cheap.
    pub(super) fn upload_seed(&mut self, user_data: &[u8]) -> HostResult<()> {
        let seed = self.seed_bytes(user_data)?;
        let pool = &self.spec.domain_pool;
        let name = self.names.cloud_init_volume();
        self.hv
            .volume_upload(pool, &name, &seed)
            .map_err(|e| self.pool_error("upload", ObjectKind::Volume, pool, &name, e))
    }

    /// A seed volume is ours when it is small, raw, and either empty (zeros:
    /// a create stopped before its upload) or a `cidata` ISO whose
    /// `instance-id` is this machine's identity.
    pub(super) fn check_seed_is_ours(&self, volume: &VolumeInfo) -> HostResult<()> {
        match self.seed_identity(volume)? {
            SeedIdentity::Empty => Ok(()),
            SeedIdentity::Of(identity) if identity == self.spec.identity => Ok(()),
            SeedIdentity::Of(identity) => Err(self.collision(
                ObjectKind::Volume,
                &format!("{}/{}", self.spec.domain_pool, volume.name),
                format!(
                    "it is the cloud-init seed of the machine with identity {identity}, not of this one ({})",
                    self.spec.identity
                ),
            )),
        }
    }

    /// Whose seed the volume is: checks that it is a seed at all (small, raw,
    /// zeros or a `cidata` ISO with an `instance-id`).
    pub(super) fn seed_identity(&self, volume: &VolumeInfo) -> HostResult<SeedIdentity> {
        let pool = &self.spec.domain_pool;
        let object = format!("{pool}/{}", volume.name);
        let format_ok = matches!(volume.format.as_deref(), None | Some("raw") | Some("iso"));
        if !format_ok || volume.capacity > MAX_SEED_BYTES {
            return Err(self.collision(
                ObjectKind::Volume,
                &object,
                format!(
                    "it is format {} and {} bytes, not a raw cloud-init seed of at most {MAX_SEED_BYTES} bytes",
                    volume.format.as_deref().unwrap_or("unknown"),
                    volume.capacity
                ),
            ));
        }
        let content = self
            .hv
            .volume_download(pool, &volume.name)
            .map_err(|e| self.pool_error("download", ObjectKind::Volume, pool, &volume.name, e))?;
        if content.iter().all(|b| *b == 0) {
            return Ok(SeedIdentity::Empty);
        }
        match seed_instance_id(&content) {
            Some(identity) if iso_volume_label(&content).as_deref() == Some(VOLUME_LABEL) => {
                Ok(SeedIdentity::Of(identity))
            }
            _ => Err(self.collision(
                ObjectKind::Volume,
                &object,
                "its content is neither empty nor a cidata ISO with an instance-id".into(),
            )),
        }
    }

    pub(super) fn seed_path(&mut self) -> HostResult<String> {
        if let Some(path) = &self.seed_path {
            return Ok(path.clone());
        }
        let path = self.created_volume_path(&self.names.cloud_init_volume(), "the cloud-init ISO")?;
        self.seed_path = Some(path.clone());
        Ok(path)
    }

    pub(super) fn remove_seed(
        &self,
        domain: Option<&DomainInfo>,
        foreign: Option<&DomainInfo>,
    ) -> HostResult<Option<LeftOnHost>> {
        let name = self.names.cloud_init_volume();
        self.remove_volume_if_ours(&self.spec.domain_pool, &name, domain, foreign, |volume| {
            self.check_seed_is_ours(volume)
        })
    }
}
