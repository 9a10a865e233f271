//! An in-memory libvirt host.
