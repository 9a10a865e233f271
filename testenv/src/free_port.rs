//! Free TCP ports on the loopback interface, for child processes to listen on.
//!
//! A port is found free here and bound later by a child process. A port the
//! kernel picks for `bind(0)` comes from its ephemeral range, which is also
//! where it picks the local port of every outgoing connection: between the
//! pick and the child's bind, any connection the tests open (to the API
//! server, to libvirtd, ...) may take it, and the child fails with "address
//! already in use". So the ports come from below the ephemeral range
//! (`net.ipv4.ip_local_port_range`), which the kernel never hands out by
//! itself. Each process walks that range from an offset of its own, and a
//! port is handed out once per process; whether it is free is checked by
//! binding it.

use std::sync::Mutex;

use anyhow::{Result, bail};

/// The lowest port handed out: above the ports daemons are usually
/// configured on (libvirtd's 16509 and 16514, the private libvirtd's TLS port).
const LOWEST: u16 = 20_000;
/// The kernel's default ephemeral range starts here.
const DEFAULT_EPHEMERAL_START: u16 = 32_768;

/// Where the next search starts, within `[LOWEST, ephemeral start)`.
static NEXT: Mutex<Option<u16>> = Mutex::new(None);

/// `N` distinct ports that were free on 127.0.0.1 a moment ago and that no
/// outgoing connection can take meanwhile (see the module docs). All
/// listeners are held until every port is picked, then closed before the
/// ports are handed to child processes.
pub fn free_loopback_ports<const N: usize>() -> Result<[u16; N]> {
    let end = ephemeral_start();
    if end <= LOWEST + 1_000 {
        bail!(
            "the kernel's ephemeral port range starts at {end} (net.ipv4.ip_local_port_range), leaving too few \
             ports below it for the test processes: raise its start above {}",
            LOWEST + 1_000
        );
    }
    let span = end - LOWEST;
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut at = next.unwrap_or_else(|| LOWEST + (std::process::id() % u32::from(span)) as u16);
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let mut tried = 0;
        *port = loop {
            let candidate = at;
            at = if at + 1 >= end { LOWEST } else { at + 1 };
            tried += 1;
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", candidate)) {
                listeners.push(listener);
                break candidate;
            }
            if tried >= span {
                bail!("no free port on 127.0.0.1 between {LOWEST} and {end}");
            }
        };
    }
    *next = Some(at);
    Ok(ports)
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_outside_the_ephemeral_range() {
        let end = ephemeral_start();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let ports: [u16; 3] = free_loopback_ports().unwrap();
            for port in ports {
                assert!((LOWEST..end).contains(&port), "port {port} is not below the ephemeral range at {end}");
                assert!(seen.insert(port), "port {port} was handed out twice");
                // Free: a child can bind it.
                std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
            }
        }
    }

    #[test]
    fn a_port_in_use_is_skipped() {
        let [first] = free_loopback_ports().unwrap();
        // The port after it is the next candidate: taken, it must be skipped.
        if let Ok(_taken) = std::net::TcpListener::bind(("127.0.0.1", first + 1)) {
            let [second] = free_loopback_ports().unwrap();
            assert_ne!(second, first + 1, "a port in use was handed out");
        }
    }
}
