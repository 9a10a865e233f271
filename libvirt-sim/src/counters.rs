//! The operations a [`Connection`](crate::Connection) performs, and how often each ran.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! ops {
    ($($name:ident),* $(,)?) => {
        /// One simulated libvirt API call; counted, and a target for fault injection.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Op { $($name),* }

        impl Op {
            /// Every operation, in declaration order.
            pub const ALL: &'static [Op] = &[$(Op::$name),*];
        }
    };
}

ops!(
    Connect,
    GetCapabilities,
    GetDomainCapabilities,
    NodeGetInfo,
    ListNetworks,
    NetworkLookup,
    NetworkGetXml,
    NetworkDefine,
    NetworkCreate,
    NetworkDestroy,
    NetworkUndefine,
    NetworkSetAutostart,
    NetworkUpdate,
    NetworkGetDhcpLeases,
    InterfaceLookup,
    ListPools,
    PoolLookup,
    PoolGetXml,
    PoolDefine,
    PoolBuild,
    PoolCreate,
    PoolDestroy,
    PoolUndefine,
    PoolRefresh,
    PoolSetAutostart,
    ListVolumes,
    VolumeLookup,
    VolumeGetXml,
    VolumeCreate,
    VolumeUpload,
    VolumeDownload,
    VolumeDelete,
    ListDomains,
    DomainLookup,
    DomainGetXml,
    DomainGetState,
    DomainDefine,
    DomainCreate,
    DomainCreateXml,
    DomainDestroy,
    DomainReset,
    DomainShutdown,
    DomainSuspend,
    DomainResume,
    DomainUndefine,
    DomainGetAutostart,
    DomainSetAutostart,
    DomainEventRegister,
    DomainEventDeregister,
);

/// Calls per operation and connections opened, for one host.
#[derive(Debug)]
pub struct Counters {
    calls: Vec<AtomicU64>,
    connections: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Self { calls: Op::ALL.iter().map(|_| AtomicU64::new(0)).collect(), connections: AtomicU64::new(0) }
    }
}

impl Counters {
    /// Counts one call of `op`; returns its 1-based number since the host was built.
    pub(crate) fn record(&self, op: Op) -> u64 {
        self.calls[op as usize].fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn record_connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times `op` was called (failed calls included).
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op as usize].load(Ordering::Relaxed)
    }

    /// All calls of all operations.
    pub fn total_calls(&self) -> u64 {
        self.calls.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Connections opened with [`connect`](crate::connect).
    pub fn connections_opened(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Every operation called at least once, with its count.
    pub fn snapshot(&self) -> Vec<(Op, u64)> {
        Op::ALL.iter().map(|op| (*op, self.calls(*op))).filter(|(_, n)| *n > 0).collect()
    }
}
