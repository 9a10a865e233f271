//! The root disk (a qcow2 overlay on the base image) and the volume calls it
//! shares with the seed ISO.

use crate::domain_xml::DomainInfo;
use crate::error::{HostError, HostResult, ObjectKind};
use crate::hypervisor::{ErrorKind, HypervisorError};
use crate::volume_xml::{BackingStore, GIB, VolumeInfo, iso_volume_xml, overlay_volume_xml, parse_volume};

use super::seed::SeedIdentity;
use super::{LeftOnHost, MachineRun};

impl MachineRun<'_> {
    /// A volume's XML: `None` when the volume is absent.
    pub(super) fn lookup_volume(&self, pool: &str, name: &str) -> HostResult<Option<VolumeInfo>> {
        match self.hv.volume_xml(pool, name) {
            Ok(xml) => parse_volume(&xml).map(Some).map_err(|e| self.unreadable(ObjectKind::Volume, name, e)),
            Err(e) if e.kind == ErrorKind::NoStorageVol => Ok(None),
            Err(e) => Err(self.pool_error("read", ObjectKind::Volume, pool, name, e)),
        }
    }

    /// Maps errors of a call on a volume, recognising a missing or inactive pool.
    pub(super) fn pool_error(
        &self,
        action: &'static str,
        kind: ObjectKind,
        pool: &str,
        name: &str,
        e: HypervisorError,
    ) -> HostError {
        match e.kind {
            ErrorKind::NoStoragePool => HostError::PoolMissing { pool: pool.to_string(), uri: self.uri.clone() },
            ErrorKind::OperationInvalid if e.is_pool_inactive() => {
                HostError::PoolInactive { pool: pool.to_string(), uri: self.uri.clone() }
            }
            _ => self.error(action, kind, &format!("{pool}/{name}"), e),
        }
    }

    /// The machine's base image: it must exist and be a standalone volume. An
    /// overlay (any volume with a backing store, which every root disk the
    /// provider makes is) or a seed ISO of ours would tie this machine to
    /// another machine's data, or to an image its owner may delete.
    pub(super) fn base_image(&self) -> HostResult<VolumeInfo> {
        let spec = self.spec;
        let image = self.lookup_volume(&spec.base_pool, &spec.image)?.ok_or_else(|| HostError::ImageMissing {
            image: spec.image.clone(),
            pool: spec.base_pool.clone(),
            uri: self.uri.clone(),
        })?;
        let why = if let Some(backing) = &image.backing {
            Some(format!("is an overlay backed by {}", backing.path))
        } else if crate::naming::is_seed_volume_name(&spec.image) {
            Some("is a cloud-init seed ISO the provider made for a machine".to_string())
        } else {
            None
        };
        match why {
            Some(why) => Err(HostError::ImageUnusable { image: spec.image.clone(), pool: spec.base_pool.clone(), why }),
            None => Ok(image),
        }
    }

    /// Before a root disk is made on `base`: no domain on the host may have
    /// the base image as a disk it writes to. Such an image is some VM's own
    /// disk that was put in the base pool, and an overlay on it would let
    /// this machine read that VM's data (and see it change under it).
    /// Domains named like a machine's are not read: the provider's own
    /// domains write only to their overlays, and a host with many machines
    /// would otherwise cost a call per machine for every new one.
    fn check_no_domain_writes(&self, base: &VolumeInfo) -> HostResult<()> {
        let domains = self.hv.domain_list().map_err(|e| self.error("list", ObjectKind::Domain, "*", e))?;
        for domain in domains.iter().filter(|d| !crate::naming::is_machine_domain_name(d)) {
            let xml = match self.hv.domain_xml(domain) {
                Ok(xml) => xml,
                Err(e) if e.kind == ErrorKind::NoDomain => continue,
                Err(e) => return Err(self.error("read", ObjectKind::Domain, domain, e)),
            };
            let info =
                crate::domain_xml::parse_domain(&xml).map_err(|e| self.unreadable(ObjectKind::Domain, domain, e))?;
            if info.writable_disk_paths.contains(&base.path) {
                return Err(HostError::ImageUnusable {
                    image: self.spec.image.clone(),
                    pool: self.spec.base_pool.clone(),
                    why: format!("is a disk that domain \"{domain}\" on {} writes to", self.uri),
                });
            }
        }
        Ok(())
    }

    pub(super) fn ensure_root_disk(&mut self) -> HostResult<()> {
        let spec = self.spec;
        let base = self.base_image()?;
        let capacity = spec.disk_gib.saturating_mul(GIB);
        if capacity < base.capacity {
            return Err(HostError::DiskTooSmall {
                disk_gib: spec.disk_gib,
                image: spec.image.clone(),
                image_bytes: base.capacity,
                min_gib: base.capacity.div_ceil(GIB),
            });
        }
        let name = self.names.overlay_volume();
        if let Some(existing) = self.lookup_volume(&spec.domain_pool, &name)? {
            self.check_overlay_is_ours(&existing, Some(&base))?;
            self.check_disk_identity(&spec.domain_pool, &existing)?;
            self.overlay_path = Some(existing.path);
            return Ok(());
        }
        self.check_no_domain_writes(&base)?;
        let backing = BackingStore {
            path: base.path.clone(),
            format: Some(spec.image_format.clone().or_else(|| base.format.clone()).unwrap_or_else(|| "qcow2".into())),
        };
        let created = self.create_volume(&spec.domain_pool, &name, &overlay_volume_xml(&name, capacity, &backing))?;
        self.check_overlay_is_ours(&created, Some(&base))?;
        self.overlay_path = Some(created.path);
        Ok(())
    }

    /// A root disk is ours when it is a qcow2 overlay on our base image.
    pub(super) fn check_overlay_is_ours(&self, volume: &VolumeInfo, base: Option<&VolumeInfo>) -> HostResult<()> {
        let backing_matches = volume.backing.as_ref().is_some_and(|backing| match base {
            Some(base) => backing.path == base.path,
            None => backing.path.rsplit('/').next() == Some(self.spec.image.as_str()),
        });
        if volume.format.as_deref() == Some("qcow2") && backing_matches {
            return Ok(());
        }
        Err(self.collision(
            ObjectKind::Volume,
            &format!("{}/{}", self.spec.domain_pool, volume.name),
            format!(
                "it is format {} backed by {}, not a qcow2 overlay on base image \"{}\"",
                volume.format.as_deref().unwrap_or("unknown"),
                volume.backing.as_ref().map(|b| b.path.as_str()).unwrap_or("nothing"),
                self.spec.image
            ),
        ))
    }

    /// A root or data disk (in `pool`) found at our name is this machine's
    /// only when the identity recorded beside it is ours: the `instance-id`
    /// of the seed ISO of the same domain name. Without a seed the disk has
    /// never booted (a domain is defined only after its seed is written, and
    /// a delete removes the seed only after the disks), so it holds no one's data.
    pub(super) fn check_disk_identity(&self, pool: &str, disk: &VolumeInfo) -> HostResult<()> {
        let seed_name = self.names.cloud_init_volume();
        let Some(seed) = self.lookup_volume(&self.spec.domain_pool, &seed_name)? else { return Ok(()) };
        match self.seed_identity(&seed)? {
            SeedIdentity::Of(identity) if identity != self.spec.identity => Err(self.collision(
                ObjectKind::Volume,
                &format!("{pool}/{}", disk.name),
                format!(
                    "its seed {seed_name} records identity {identity}, not this machine's ({}): \
                     the disk is another machine's",
                    self.spec.identity
                ),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn overlay_path(&mut self) -> HostResult<String> {
        if let Some(path) = &self.overlay_path {
            return Ok(path.clone());
        }
        let path = self.created_volume_path(&self.names.overlay_volume(), "the root disk")?;
        self.overlay_path = Some(path.clone());
        Ok(path)
    }

    /// Creates volume `name` in `pool` from `xml` and reads it back. A volume
    /// created concurrently under the same name is read back too; the caller
    /// checks that it is ours.
    pub(super) fn create_volume(&self, pool: &str, name: &str, xml: &str) -> HostResult<VolumeInfo> {
        match self.hv.volume_create(pool, xml) {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::StorageVolExists => {}
            Err(e) => return Err(self.pool_error("create", ObjectKind::Volume, pool, name, e)),
        }
        self.lookup_volume(pool, name)?.ok_or_else(|| {
            self.error(
                "read back",
                ObjectKind::Volume,
                name,
                HypervisorError::new(ErrorKind::NoStorageVol, 50, "volume vanished after create"),
            )
        })
    }

    /// The path of a volume an earlier step created in domainPool, for the domain XML.
    pub(super) fn created_volume_path(&self, name: &str, what: &str) -> HostResult<String> {
        self.created_volume_path_in(&self.spec.domain_pool, name, what)
    }

    /// The path of a volume an earlier step created in `pool`, for the domain XML.
    pub(super) fn created_volume_path_in(&self, pool: &str, name: &str, what: &str) -> HostResult<String> {
        let volume = self.lookup_volume(pool, name)?.ok_or_else(|| {
            self.error(
                "find",
                ObjectKind::Volume,
                name,
                HypervisorError::new(
                    ErrorKind::NoStorageVol,
                    50,
                    format!("{what} must be created before the domain is defined"),
                ),
            )
        })?;
        Ok(volume.path)
    }

    pub(super) fn delete_volume(&self, pool: &str, name: &str) -> HostResult<()> {
        match self.hv.volume_delete(pool, name) {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(self.pool_error("delete", ObjectKind::Volume, pool, name, e)),
        }
    }

    /// A volume lookup in `pool` for delete: a missing pool means nothing to delete.
    pub(super) fn lookup_volume_for_delete(&self, pool: &str, name: &str) -> HostResult<Option<VolumeInfo>> {
        match self.lookup_volume(pool, name) {
            Err(HostError::PoolMissing { .. }) => Ok(None),
            other => other,
        }
    }

    pub(super) fn remove_overlay(
        &self,
        domain: Option<&DomainInfo>,
        foreign: Option<&DomainInfo>,
    ) -> HostResult<Option<LeftOnHost>> {
        let pool = &self.spec.domain_pool;
        self.remove_volume_if_ours(pool, &self.names.overlay_volume(), domain, foreign, |volume| {
            let base = match self.lookup_volume(&self.spec.base_pool, &self.spec.image) {
                Ok(base) => base,
                Err(HostError::PoolMissing { .. }) => None,
                Err(e) => return Err(e),
            };
            self.check_overlay_is_ours(volume, base.as_ref())?;
            self.check_disk_identity(pool, volume)
        })
    }

    /// Removes volume `name` of `pool` when it is ours; absent (or its pool
    /// gone), there is nothing to do. One the foreign domain at our name uses
    /// is left and returned; one our domain uses is ours; any other must pass
    /// `is_ours` (an error leaves it).
    pub(super) fn remove_volume_if_ours(
        &self,
        pool: &str,
        name: &str,
        domain: Option<&DomainInfo>,
        foreign: Option<&DomainInfo>,
        is_ours: impl FnOnce(&VolumeInfo) -> HostResult<()>,
    ) -> HostResult<Option<LeftOnHost>> {
        let Some(volume) = self.lookup_volume_for_delete(pool, name)? else { return Ok(None) };
        if let Some(kept) = self.used_by_foreign(pool, &volume, foreign) {
            return Ok(Some(kept));
        }
        if !domain.is_some_and(|d| d.disk_paths.contains(&volume.path)) {
            is_ours(&volume)?;
        }
        self.delete_volume(pool, name).map(|()| None)
    }

    /// Volume `name` of `pool`, raw and exactly `size` bytes: one found there
    /// must pass `is_ours`, and is replaced when it has another size (it was
    /// made for other bootstrap data); else it is created.
    pub(super) fn ensure_sized_volume(
        &self,
        pool: &str,
        name: &str,
        size: u64,
        is_ours: impl FnOnce(&VolumeInfo) -> HostResult<()>,
    ) -> HostResult<VolumeInfo> {
        if let Some(existing) = self.lookup_volume(pool, name)? {
            is_ours(&existing)?;
            if existing.capacity == size {
                return Ok(existing);
            }
            self.delete_volume(pool, name)?;
        }
        self.create_volume(pool, name, &iso_volume_xml(name, size))
    }

    /// A volume (in `pool`) of ours by name that the foreign domain at our
    /// name uses: it is left alone.
    pub(super) fn used_by_foreign(
        &self,
        pool: &str,
        volume: &VolumeInfo,
        foreign: Option<&DomainInfo>,
    ) -> Option<LeftOnHost> {
        let foreign = foreign.filter(|d| d.disk_paths.contains(&volume.path))?;
        Some(LeftOnHost {
            kind: ObjectKind::Volume,
            object: format!("{pool}/{}", volume.name),
            why: format!("domain \"{}\", which is not this LibvirtMachine's, uses it", foreign.name),
        })
    }
}
