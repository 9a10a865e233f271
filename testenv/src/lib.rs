//! A local control plane for tests.
