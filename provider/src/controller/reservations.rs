//! The memory of machines placed on a host whose domains the host may not
//! count yet: [`super::placement`] reserves it when it chooses a host, and
//! subtracts it from the host's answers until the domain is created.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a reservation is kept after its domain was created, for the
/// placements that asked their hosts before that (no host call lasts this long).
const AFTER_CREATION: Duration = Duration::from_secs(600);
/// A machine placed but never created (its bootstrap data never came) stops
/// holding memory after this.
const UNCREATED: Duration = Duration::from_secs(30 * 60);

#[derive(Debug)]
pub(super) struct Reserved {
    uri: String,
    bytes: u64,
    since: Instant,
    created: Option<Instant>,
}

/// Memory of machines placed on a host whose domains the host may not count yet.
#[derive(Debug, Default)]
pub struct Reservations {
    by_machine: Mutex<HashMap<String, Reserved>>,
}

impl Reserved {
    /// `bytes` reserved on `uri` from now on, for a machine not created yet.
    pub(super) fn new(uri: String, bytes: u64) -> Self {
        Self { uri, bytes, since: Instant::now(), created: None }
    }
}

impl Reservations {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Reserved>> {
        self.by_machine.lock().expect("placement reservations lock")
    }

    /// The memory reserved on `uri` that an answer asked for at `asked` does not
    /// count: of machines placed and not created, or created after the question.
    pub(super) fn reserved_on(map: &HashMap<String, Reserved>, uri: &str, asked: Instant) -> u64 {
        map.values().filter(|r| r.uri == uri && r.created.is_none_or(|at| at > asked)).map(|r| r.bytes).sum()
    }

    /// The machine's domain is defined on its host: answers asked from now on count it.
    pub fn created(&self, uid: &str) {
        if let Some(r) = self.lock().get_mut(uid) {
            r.created.get_or_insert_with(Instant::now);
        }
    }

    /// Forgets machines that are gone and reservations that ran out.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let now = Instant::now();
        self.lock().retain(|uid, r| {
            keep(uid)
                && r.created.is_none_or(|at| now.duration_since(at) < AFTER_CREATION)
                && now.duration_since(r.since) < UNCREATED
        });
    }
}
