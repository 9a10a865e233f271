//! The data disks (`spec.dataDisks`): their pools checked before anything
//! is made, each volume created after the root disk and removed before the
//! seed, under the root disk's ownership rules.

use crate::data_disk::{DataDisk, DataDiskDevice, targets};
use crate::domain_xml::DomainInfo;
use crate::error::{HostError, HostResult, ObjectKind, PoolProblem};
use crate::volume_xml::{GIB, VolumeInfo, data_volume_xml};

use super::{LeftOnHost, MachineRun};

impl MachineRun<'_> {
    /// The volume name of `disk`.
    fn data_volume(&self, disk: &DataDisk) -> String {
        self.names.data_volume(&disk.name, disk.format.as_str())
    }

    /// Every pool a data disk names besides the domain pool (which the
    /// LibvirtCluster's check covers) exists, is active and holds volume
    /// files: two calls per such pool, none for disks in the domain pool.
    pub(super) fn data_disk_pools_usable(&self) -> HostResult<()> {
        let mut checked: Vec<&str> = Vec::new();
        for disk in &self.spec.data_disks {
            if disk.pool == self.spec.domain_pool || checked.contains(&disk.pool.as_str()) {
                continue;
            }
            checked.push(&disk.pool);
            let problem = match crate::infra::check_pool(self.hv, &disk.pool) {
                Ok(()) => continue,
                Err(HostError::PoolMissing { .. }) => PoolProblem::Missing,
                Err(HostError::PoolInactive { .. }) => PoolProblem::Inactive,
                Err(HostError::PoolTypeUnsupported { pool_type, .. }) => PoolProblem::Unsupported(pool_type),
                Err(e) => return Err(e),
            };
            return Err(HostError::DataDiskPool {
                disk: disk.name.clone(),
                pool: disk.pool.clone(),
                uri: self.uri.clone(),
                problem,
            });
        }
        Ok(())
    }

    /// Creates each data disk that does not exist; one that does must be
    /// ours (see [`Self::check_data_volume_is_ours`] and the seed's identity).
    pub(super) fn ensure_data_disks(&mut self) -> HostResult<()> {
        let mut paths = Vec::with_capacity(self.spec.data_disks.len());
        for disk in &self.spec.data_disks {
            let name = self.data_volume(disk);
            let volume = match self.lookup_volume(&disk.pool, &name)? {
                Some(existing) => {
                    self.check_data_volume_is_ours(disk, &existing)?;
                    self.check_disk_identity(&disk.pool, &existing)?;
                    existing
                }
                None => {
                    let xml = data_volume_xml(&name, disk.size_gib.saturating_mul(GIB), disk.format.as_str());
                    let created = self.create_volume(&disk.pool, &name, &xml)?;
                    self.check_data_volume_is_ours(disk, &created)?;
                    created
                }
            };
            paths.push(volume.path);
        }
        self.data_disk_paths = Some(paths);
        Ok(())
    }

    /// A data disk at our name is ours when it is what we create: a volume
    /// in the disk's format, exactly its size, with no backing store.
    fn check_data_volume_is_ours(&self, disk: &DataDisk, volume: &VolumeInfo) -> HostResult<()> {
        let format = disk.format.as_str();
        let capacity = disk.size_gib.saturating_mul(GIB);
        if volume.backing.is_none() && volume.format.as_deref() == Some(format) && volume.capacity == capacity {
            return Ok(());
        }
        Err(self.collision(
            ObjectKind::Volume,
            &format!("{}/{}", disk.pool, volume.name),
            format!(
                "it is format {} of {} bytes backed by {}, not the empty {format} volume of {} GiB that data disk \
                 \"{}\" is made as",
                volume.format.as_deref().unwrap_or("unknown"),
                volume.capacity,
                volume.backing.as_ref().map(|b| b.path.as_str()).unwrap_or("nothing"),
                disk.size_gib,
                disk.name,
            ),
        ))
    }

    /// The data disks' devices for the domain, in `spec.dataDisks` order.
    pub(super) fn data_disk_devices(&mut self) -> HostResult<Vec<DataDiskDevice>> {
        let paths = match self.data_disk_paths.take() {
            Some(paths) => paths,
            None => self
                .spec
                .data_disks
                .iter()
                .map(|disk| {
                    let name = self.data_volume(disk);
                    self.created_volume_path_in(&disk.pool, &name, "a data disk")
                })
                .collect::<HostResult<_>>()?,
        };
        let targets = targets(&self.spec.data_disks);
        Ok(self
            .spec
            .data_disks
            .iter()
            .zip(paths)
            .zip(targets)
            .map(|((disk, path), target)| DataDiskDevice {
                path,
                format: disk.format,
                bus: disk.bus,
                target,
                serial: disk.name.clone(),
            })
            .collect())
    }

    /// Removes each data disk that is ours; one a foreign domain at our name
    /// uses, or one that fails the ownership rules, is left and returned.
    /// One result per disk.
    pub(super) fn remove_data_disks(
        &self,
        domain: Option<&DomainInfo>,
        foreign: Option<&DomainInfo>,
    ) -> Vec<HostResult<Option<LeftOnHost>>> {
        self.spec.data_disks.iter().map(|disk| self.remove_data_disk(disk, domain, foreign)).collect()
    }

    fn remove_data_disk(
        &self,
        disk: &DataDisk,
        domain: Option<&DomainInfo>,
        foreign: Option<&DomainInfo>,
    ) -> HostResult<Option<LeftOnHost>> {
        self.remove_volume_if_ours(&disk.pool, &self.data_volume(disk), domain, foreign, |volume| {
            self.check_data_volume_is_ours(disk, volume)?;
            self.check_disk_identity(&disk.pool, volume)
        })
    }
}
