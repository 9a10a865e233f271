//! Base images the provider downloads: stored in a volume of their own,
//! streamed in, removed again when the stream fails.

use std::io::Read;

use crate::hypervisor::{ErrorKind, Hypervisor, HypervisorError, Result};
use crate::volume_xml::{image_volume_xml, parse_volume};

/// Creates `volume` in `pool`, exactly `length` bytes large, and uploads
/// `length` bytes from `source` into it (see
/// [`Hypervisor::volume_upload_from`]). On any failure (the source's
/// included) the volume is deleted again, so a volume of that name holds a
/// whole upload. A volume of that name that is already there is refused
/// (`StorageVolExists`) and left alone.
pub fn store_image(hv: &dyn Hypervisor, pool: &str, volume: &str, length: u64, source: &mut dyn Read) -> Result<()> {
    hv.volume_create(pool, &image_volume_xml(volume, length))?;
    if let Err(e) = hv.volume_upload_from(pool, volume, length, source) {
        if let Err(deleting) = hv.volume_delete(pool, volume) {
            tracing::warn!(%pool, %volume, error = %deleting, "cannot remove the partial image volume");
        }
        return Err(e);
    }
    Ok(())
}

/// What [`remove_unused_image`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// The volume is gone (it was deleted now).
    Removed,
    /// Volumes (`pool/name`) still have it as their backing store: kept.
    InUse(Vec<String>),
    /// There was no such volume.
    Absent,
}

/// Deletes the downloaded image `volume` of `pool` unless a volume of any
/// active pool of the host is an overlay on it.
pub fn remove_unused_image(hv: &dyn Hypervisor, pool: &str, volume: &str) -> Result<Removal> {
    let xml = match hv.volume_xml(pool, volume) {
        Ok(xml) => xml,
        Err(e) if e.kind == ErrorKind::NoStorageVol => return Ok(Removal::Absent),
        Err(e) => return Err(e),
    };
    let path = parse_volume(&xml)
        .map_err(|why| HypervisorError::new(ErrorKind::XmlError, 0, format!("volume {pool}/{volume}: {why}")))?
        .path;
    let users = hv.volumes_backed_by(&path)?;
    if !users.is_empty() {
        return Ok(Removal::InUse(users));
    }
    match hv.volume_delete(pool, volume) {
        Ok(()) => Ok(Removal::Removed),
        Err(e) if e.kind == ErrorKind::NoStorageVol => Ok(Removal::Absent),
        Err(e) => Err(e),
    }
}
