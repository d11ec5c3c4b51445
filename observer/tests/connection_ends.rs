//! A connection's end that finds its interval's connection counts full
//! (`CONNECTIONS`, one interval's keys) is queued and counted, not lost: a
//! lost end would leave the connection counted open for ever. Alone in its
//! test binary: the failpoint that shrinks the map holds for the process.
mod common;

use common::{OUTBOUND, Observer, collect_until};
use observer_common::lost;
use observer_testing::Netns;

const PORT: u16 = 5440;

/// The map holds two keys an interval. A pool of 20 is counted in one
/// interval (its key and the listener's); in the next, two other clients
/// fill the map (the second's key and the listener's; the third's starts
/// find no room and are counted lost, as before), then the pool closes:
/// its 20 ends find the map full, are queued and counted in the next
/// round, with their lifetimes, and the pool leaves the gauge.
#[test]
fn an_end_that_finds_the_connection_counts_full_is_queued_and_counted() {
    fail::cfg("connections-entries", "return(2)").unwrap();
    let ns = Netns::new();
    let to = format!("127.0.0.1:{PORT}");
    let _server = ns.serve(&["--listen", &to, "--hold"]);
    // Its own load: the failpoint shrinks the maps a load makes.
    let mut obs = Observer::start_own();
    let pool = ns.client_holding(&["--to", &to, "--count", "20"]);
    collect_until(&mut obs, |o| o.open_connections(pool.pid(), OUTBOUND, PORT) >= 20);
    assert_eq!(obs.open_connections(pool.pid(), OUTBOUND, PORT), 20);
    let lost_before = obs.lost();

    let second = ns.client_holding(&["--to", &to, "--count", "5"]);
    let third = ns.client_holding(&["--to", &to, "--count", "5"]);
    let pool_pid = pool.pid();
    pool.close();
    let dport = format!("dport = :{PORT}");
    assert_eq!(ns.established(&dport, Some(pool_pid)), 0, "ss: the pool's connections are gone");
    for _ in 0..3 {
        obs.collect();
    }
    let lost_now = obs.lost();
    let lost = |slot: u32| lost_now[slot as usize] - lost_before[slot as usize];
    assert_eq!(lost(lost::CONNECTIONS_FULL), 5, "the third's starts found no room: {lost_now:?}");
    assert_eq!(lost(lost::QUEUED_ENDS_FULL), 0);
    assert_eq!(obs.open_connections(pool_pid, OUTBOUND, PORT), 0, "every key: {:#?}", obs.open_connection_keys());
    let ended = obs.connection_counts(pool_pid, OUTBOUND, PORT);
    assert_eq!((ended.established, ended.closed.iter().sum::<u64>()), (20, 20), "{ended:?}");
    assert_eq!(obs.open_connections(second.pid(), OUTBOUND, PORT), 5);
    assert_eq!(obs.open_connections(third.pid(), OUTBOUND, PORT), 0, "left out whole");
    fail::remove("connections-entries");
}
