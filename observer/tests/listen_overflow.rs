//! A listener that never accepts: its queue fills and the kernel drops new
//! connections. observer must charge the drops to the listener's owner and
//! port, and match the namespace's TcpExtListenOverflows exactly.
mod common;

use std::time::Duration;

use common::{Observer, collect_until};
use observer_testing::Netns;

/// Overflow a never-accepting listener on `addr` (port `port`) with 8
/// connection attempts; observer starts before the listener exists, or
/// after (then no listen() was seen and the owner is found another way).
fn overflow(addr: &str, port: u16, listener_first: bool) {
    let ns = Netns::new();
    let mut obs = (!listener_first).then(Observer::start);
    let server = ns.serve(&["--listen", addr, "--backlog", "1", "--never-accept"]);
    let mut obs = obs.take().unwrap_or_else(Observer::start);
    let before = ns.nstat("TcpExtListenOverflows");

    // Each client socket is closed after 200 ms, so no SYN is retransmitted
    // after the clients are done and the counters settle.
    ns.client(&["--to", addr, "--count", "8", "--nonblocking", "200ms"]);
    std::thread::sleep(Duration::from_millis(300));
    let overflows = ns.nstat("TcpExtListenOverflows") - before;
    assert!(overflows > 0, "the scenario must overflow the accept queue");

    collect_until(&mut obs, |o| o.listen_drops(server.pid(), port) >= overflows);
    assert_eq!(obs.listen_drops(server.pid(), port), overflows);
}

#[test]
fn drops_equal_listen_overflows_and_are_charged_to_the_owner() {
    overflow("127.0.0.1:8081", 8081, false);
}

#[test]
fn a_listener_older_than_observer_is_charged_to_its_owner_too() {
    overflow("[::1]:8082", 8082, true);
}

/// A listening socket on 127.0.0.1:`port` in the namespace at `netns`,
/// made by a thread of this process that enters it: so no process lives
/// in that namespace, and its `ip netns` handle is the only way to it.
fn listen_in(netns: &std::path::Path, port: u16) -> std::os::fd::OwnedFd {
    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, socket};
    let netns = netns.to_owned();
    std::thread::spawn(move || {
        let handle = std::fs::File::open(&netns).unwrap();
        nix::sched::setns(std::os::fd::AsFd::as_fd(&handle), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::empty(), None).unwrap();
        bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::new(127, 0, 0, 1, port)).unwrap();
        listen(&fd, Backlog::new(1).unwrap()).unwrap();
        fd
    })
    .join()
    .unwrap()
}

/// A namespace missing from some sweeps (here: its `ip netns` handle
/// unmounted, then mounted again) must not have its listeners' drops
/// counted twice when it is back.
#[test]
fn a_namespace_missing_from_some_sweeps_does_not_count_its_drops_twice() {
    let ns = Netns::new();
    let port = 8083;
    let mut obs = Observer::start();
    let _listener = listen_in(&ns.path(), port);
    let owner = std::process::id();
    let before = ns.nstat("TcpExtListenOverflows");
    let overflow = || {
        ns.client(&["--to", "127.0.0.1:8083", "--count", "8", "--nonblocking", "200ms"]);
        std::thread::sleep(Duration::from_millis(300));
        ns.nstat("TcpExtListenOverflows") - before
    };
    let first = overflow();
    assert!(first > 0, "the scenario must overflow the accept queue");
    collect_until(&mut obs, |o| o.listen_drops(owner, port) >= first);
    assert_eq!(obs.listen_drops(owner, port), first);

    // Unmount the handle (kept open to mount it back): rounds go by
    // without the namespace.
    let handle = std::fs::File::open(ns.path()).unwrap();
    nix::mount::umount2(&ns.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    for _ in 0..3 {
        obs.collect();
    }
    let back = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
    nix::mount::mount(Some(back.as_str()), &ns.path(), None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
        .unwrap();

    let total = overflow();
    assert!(total > first, "the second batch overflows too");
    collect_until(&mut obs, |o| o.listen_drops(owner, port) >= total);
    // Settle: a double count would show in the rounds after.
    for _ in 0..3 {
        obs.collect();
    }
    assert_eq!(obs.listen_drops(owner, port), total, "TcpExtListenOverflows says {total}");
}
