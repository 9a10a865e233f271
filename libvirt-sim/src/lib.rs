#![doc = include_str!("../README.md")]

mod capabilities;
mod connection;
mod counters;
mod domain;
mod domain_capabilities;
mod error;
mod events;
mod faults;
mod host;
mod ids;
mod network;
mod size_units;
mod sparse;
mod storage;
mod xml_scan;

pub use capabilities::{Capabilities, NodeInfo};
pub use connection::{Connection, DomainInfo, NetworkInfo, PoolInfo, VolumeInfo, VolumeUploadStream, connect};
pub use counters::{Counters, Op};
pub use domain::{DomainState, undefine_flags};
pub use domain_capabilities::DomainCapabilities;
pub use error::{Error, ErrorCode, Result};
pub use events::{DomainEvent, DomainEventKind, event_detail};
pub use faults::Faults;
pub use host::{Host, HostBuilder, HostConfig, LEASE_SECONDS};
pub use ids::{Mac, Uuid};
pub use network::{Lease, UpdateCommand, UpdateSection, update_flags};
