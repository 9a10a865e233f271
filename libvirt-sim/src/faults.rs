//! Fault injection: failing the Nth call of an operation, latency, calls that hang,
//! guests that never ask for DHCP.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::counters::Op;
use crate::error::Error;
use crate::ids::Mac;

#[derive(Debug, Default)]
struct Plan {
    /// op -> (absolute call number, error)
    failures: HashMap<Op, Vec<(u64, Error)>>,
    latency: HashMap<Op, Duration>,
    /// op -> until when its calls hang (`None`: until released)
    hangs: HashMap<Op, Option<Instant>>,
    silent_macs: HashSet<Mac>,
    silent_domains: HashSet<String>,
    random: Option<RandomFailures>,
}

/// Calls that fail by chance (see [`Faults::fail_randomly`]).
#[derive(Debug)]
struct RandomFailures {
    /// Out of 1,000,000 calls.
    per_million: u64,
    /// xorshift64 state: the same seed fails the same call numbers.
    state: u64,
    error: Error,
}

/// The faults planned for one host. Get it with [`Host::faults`](crate::Host::faults).
#[derive(Debug, Default)]
pub struct Faults {
    armed: AtomicBool,
    plan: Mutex<Plan>,
    /// Wakes hung calls when a hang is released.
    released: Condvar,
}

impl Faults {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.armed.store(true, Ordering::Relaxed);
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the `n`th call of `op` from now (1 = the next one) fail with `error`.
    /// `calls_so_far` is the op's counter; [`Host::fail_nth`](crate::Host::fail_nth) passes it.
    pub(crate) fn fail_at(&self, op: Op, absolute_call: u64, error: Error) {
        self.plan().failures.entry(op).or_default().push((absolute_call, error));
    }

    /// Every call of `op` sleeps `latency` before it runs (zero removes it).
    pub fn set_latency(&self, op: Op, latency: Duration) {
        let mut plan = self.plan();
        if latency.is_zero() {
            plan.latency.remove(&op);
        } else {
            plan.latency.insert(op, latency);
        }
    }

    /// Every call of `op` from now on blocks, as on a daemon that accepted the
    /// request and never answers: until [`release`](Self::release) (or
    /// [`clear`](Self::clear)) when `duration` is `None`, else for at most
    /// `duration` after the hang was set. `Op::Connect` hangs `connect`.
    /// Calls already waiting keep waiting; a hung call then runs normally.
    pub fn hang(&self, op: Op, duration: Option<Duration>) {
        self.plan().hangs.insert(op, duration.map(|d| Instant::now() + d));
    }

    /// Ends the hang of `op`: waiting calls go on, new calls do not wait.
    pub fn release(&self, op: Op) {
        self.plan().hangs.remove(&op);
        self.released.notify_all();
    }

    /// From now on each call of any operation except `Op::Connect` fails with
    /// `error` with the given probability (0.0 to 1.0), chosen by a
    /// pseudo-random sequence from `seed`, so a run can be repeated. Until
    /// [`clear`](Self::clear).
    pub fn fail_randomly(&self, probability: f64, seed: u64, error: Error) {
        let per_million = (probability.clamp(0.0, 1.0) * 1_000_000.0) as u64;
        self.plan().random = Some(RandomFailures { per_million, state: seed.max(1), error });
    }

    /// The guest with this MAC never asks for a DHCP lease.
    pub fn guest_never_asks_dhcp(&self, mac: &str) {
        if let Some(mac) = Mac::parse(mac) {
            self.plan().silent_macs.insert(mac);
        }
    }

    /// No interface of the domain named `domain` ever asks for a DHCP lease.
    pub fn domain_never_asks_dhcp(&self, domain: &str) {
        self.plan().silent_domains.insert(domain.to_string());
    }

    /// Removes every planned fault.
    pub fn clear(&self) {
        *self.plan() = Plan::default();
        self.armed.store(false, Ordering::Relaxed);
        self.released.notify_all();
    }

    /// Waits out a hang, applies latency, then returns the planned error for call number
    /// `call` of `op`.
    pub(crate) fn on_call(&self, op: Op, call: u64) -> Option<Error> {
        if !self.armed.load(Ordering::Relaxed) {
            return None;
        }
        let (latency, error) = {
            let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
            while let Some(until) = plan.hangs.get(&op).copied() {
                plan = match until {
                    None => self.released.wait(plan).unwrap_or_else(|e| e.into_inner()),
                    Some(until) => {
                        let left = until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        self.released.wait_timeout(plan, left).unwrap_or_else(|e| e.into_inner()).0
                    }
                };
            }
            let latency = plan.latency.get(&op).copied();
            let mut error = plan.failures.get_mut(&op).and_then(|list| {
                let i = list.iter().position(|(n, _)| *n == call)?;
                Some(list.remove(i).1)
            });
            if error.is_none()
                && op != Op::Connect
                && let Some(random) = plan.random.as_mut()
            {
                random.state ^= random.state << 13;
                random.state ^= random.state >> 7;
                random.state ^= random.state << 17;
                if random.state % 1_000_000 < random.per_million {
                    error = Some(random.error.clone());
                }
            }
            (latency, error)
        };
        if let Some(d) = latency {
            std::thread::sleep(d);
        }
        error
    }

    pub(crate) fn is_silent(&self, domain: &str, mac: Mac) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        let plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        plan.silent_macs.contains(&mac) || plan.silent_domains.contains(domain)
    }
}
