//! The Ignition config of a machine whose bootstrap data is Ignition
//! (Flatcar, Fedora CoreOS): a raw volume in domainPool holding the config
//! byte for byte, which QEMU hands to the guest as a firmware config (fw_cfg)
//! entry, where Ignition's QEMU platform reads it. The seed ISO is made as
//! for any machine (it records the machine's identity) with a user-data that
//! only says where the bootstrap data went.

use crate::domain_xml::DomainInfo;
use crate::error::{HostResult, ObjectKind};
use crate::volume_xml::VolumeInfo;

use super::{LeftOnHost, MAX_SEED_BYTES, MachineRun};

/// The user-data of the seed of a machine whose bootstrap data is Ignition.
pub const IGNITION_SEED_USER_DATA: &[u8] = b"#cloud-config\n# The bootstrap data of this machine is an Ignition config, in QEMU's firmware config\n# entries opt/com.coreos/config and opt/org.flatcar-linux/config.\n";

impl MachineRun<'_> {
    /// The seed's user-data given the bootstrap data: the data itself, or
    /// for an Ignition config, [`IGNITION_SEED_USER_DATA`].
    pub(super) fn seed_user_data<'b>(&self, bootstrap: &'b [u8]) -> &'b [u8] {
        if self.spec.bootstrap_format.is_ignition() { IGNITION_SEED_USER_DATA } else { bootstrap }
    }

    /// Creates the config's volume (or finds ours) and writes the config into
    /// it. Rewritten while the domain is not yet defined, as the seed is.
    pub(super) fn ensure_ignition(&mut self, config: &[u8]) -> HostResult<()> {
        let pool = self.spec.domain_pool.clone();
        let name = self.names.ignition_volume();
        let size = config.len() as u64;
        let volume = self.ensure_sized_volume(&pool, &name, size, |found| self.check_ignition_is_ours(found))?;
        self.hv
            .volume_upload(&pool, &name, config)
            .map_err(|e| self.pool_error("upload", ObjectKind::Volume, &pool, &name, e))?;
        self.ignition_path = Some(volume.path);
        Ok(())
    }

    /// An Ignition volume found at our name is ours when it is what we make
    /// (raw, no backing file, at most [`MAX_SEED_BYTES`]) and the seed of the
    /// same domain name, if any, records our identity.
    fn check_ignition_is_ours(&self, volume: &VolumeInfo) -> HostResult<()> {
        let raw = matches!(volume.format.as_deref(), None | Some("raw"));
        if !raw || volume.backing.is_some() || volume.capacity > MAX_SEED_BYTES {
            return Err(self.collision(
                ObjectKind::Volume,
                &format!("{}/{}", self.spec.domain_pool, volume.name),
                format!(
                    "it is format {} and {} bytes{}, not a raw Ignition config of at most {MAX_SEED_BYTES} bytes",
                    volume.format.as_deref().unwrap_or("unknown"),
                    volume.capacity,
                    volume.backing.as_ref().map(|b| format!(" backed by {}", b.path)).unwrap_or_default(),
                ),
            ));
        }
        self.check_disk_identity(&self.spec.domain_pool, volume)
    }

    /// The config's path for the domain XML; `None` for a machine whose
    /// bootstrap data is cloud-init's.
    pub(super) fn ignition_path(&mut self) -> HostResult<Option<String>> {
        if !self.spec.bootstrap_format.is_ignition() {
            return Ok(None);
        }
        if let Some(path) = &self.ignition_path {
            return Ok(Some(path.clone()));
        }
        let path = self.created_volume_path(&self.names.ignition_volume(), "the Ignition config")?;
        self.ignition_path = Some(path.clone());
        Ok(Some(path))
    }

    /// Removes the config's volume when it is ours. With our domain on the
    /// host, its XML says whether it has one (no call); without it, the
    /// volume is looked up (a create that stopped before its define).
    pub(super) fn remove_ignition(
        &self,
        domain: Option<&DomainInfo>,
        foreign: Option<&DomainInfo>,
    ) -> HostResult<Option<LeftOnHost>> {
        let pool = &self.spec.domain_pool;
        let name = self.names.ignition_volume();
        if let Some(domain) = domain
            && !domain.disk_paths.iter().any(|p| p.rsplit('/').next() == Some(name.as_str()))
        {
            return Ok(None);
        }
        self.remove_volume_if_ours(pool, &name, domain, foreign, |volume| self.check_ignition_is_ours(volume))
    }
}
