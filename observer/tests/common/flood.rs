//! Clients that never finish their request, flooding the metrics port.
use std::{
    io::{ErrorKind, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use observer::export::http::MAX_CONNECTIONS;

/// The 400, and twice the endpoint's cap, so it has to make room.
pub const SLOW_CLIENTS: usize = if 2 * MAX_CONNECTIONS > 400 { 2 * MAX_CONNECTIONS } else { 400 };

/// `SLOW_CLIENTS` connections, each sending an unfinished request: its
/// first line, then a header that never ends, 1 KiB at a time (toward the
/// ~390 KiB that once took the daemon to 150 MiB); a connection the daemon
/// closes is opened again. Until `stop`; returns how many were opened.
pub fn flood(port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let chunk = [b'a'; 1024];
        let opened = AtomicU64::new(0);
        let open = || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
            s.set_nonblocking(true).ok()?;
            let _ = (&s).write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Never-Ends: ");
            opened.fetch_add(1, Ordering::Relaxed);
            Some(s)
        };
        let mut clients: Vec<Option<TcpStream>> = (0..SLOW_CLIENTS).map(|_| open()).collect();
        while !stop.load(Ordering::Relaxed) {
            for client in &mut clients {
                let alive = match client {
                    Some(s) => match s.write(&chunk) {
                        Ok(_) => true,
                        Err(e) => e.kind() == ErrorKind::WouldBlock,
                    },
                    None => false,
                };
                if !alive {
                    *client = open();
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        opened.load(Ordering::Relaxed)
    })
}

/// Room for the flood's sockets in this process (and in the daemon, which
/// inherits the limit), up to the hard limit.
pub fn room_for_the_flood() {
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(hard > 2 * SLOW_CLIENTS as u64, "RLIMIT_NOFILE's hard limit {hard} is too low for the flood");
}
