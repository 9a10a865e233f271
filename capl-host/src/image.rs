//! Base images the provider downloads: stored in a volume of their own,
//! streamed in, removed again when the stream fails.

use std::io::Read;

use crate::hypervisor::{Hypervisor, Result};
use crate::volume_xml::image_volume_xml;

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
