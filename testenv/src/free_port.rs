//! Free TCP ports on the loopback interface.

use anyhow::{Context, Result};

/// `N` distinct ports that were free on 127.0.0.1 a moment ago: the kernel picks them, and
/// all listeners are held until every port is picked (so no two are equal), then closed
/// before the ports are handed to child processes.
pub fn free_loopback_ports<const N: usize>() -> Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener =
            std::net::TcpListener::bind(("127.0.0.1", 0)).context("binding 127.0.0.1:0 to find a free port")?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}
