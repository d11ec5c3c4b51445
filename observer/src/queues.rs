//! Which listeners' accept queues get series of their own: at most
//! `--max-listeners` per network namespace, the fullest (a pod that opens
//! 10,000 listeners must not make 20,000 gauges). The rest of a namespace
//! are summed into one pair of series marked `otel.metric.overflow`, so the
//! namespace's total queued against its total backlog stays whole.
//!
//! Only the gauges are bounded here: the per-listener state the collector
//! keeps (last drop count, owner) is a few dozen bytes per listener, a
//! small fraction of what the kernel itself holds for one, and it is what
//! keeps the overflow counts exact.
use std::cmp::Ordering;

use crate::node::sock_diag::Listener;

/// A namespace's listeners beyond the bound, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    pub listeners: u64,
    pub queued: u64,
    pub backlog: u64,
}

/// Fuller first: by the share of the backlog in use, then by connections
/// waiting, then by port (a stable order between rounds).
fn fuller(a: &Listener, b: &Listener) -> Ordering {
    let share = |l: &Listener, other: &Listener| u64::from(l.queued) * u64::from(other.backlog.max(1));
    share(b, a).cmp(&share(a, b)).then(b.queued.cmp(&a.queued)).then(a.port.cmp(&b.port))
}

/// The `max` fullest of one namespace's `listeners`, and the others summed
/// (None when all fit).
pub fn fullest(mut listeners: Vec<Listener>, max: usize) -> (Vec<Listener>, Option<Folded>) {
    if listeners.len() <= max {
        return (listeners, None);
    }
    listeners.sort_by(fuller);
    let rest = listeners.split_off(max);
    let folded = rest.iter().fold(Folded::default(), |f, l| Folded {
        listeners: f.listeners + 1,
        queued: f.queued + u64::from(l.queued),
        backlog: f.backlog + u64::from(l.backlog),
    });
    (listeners, Some(folded))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(port: u16, queued: u32, backlog: u32) -> Listener {
        Listener {
            netns: 1,
            family: 2,
            address: [127, 0, 0, 1].into(),
            port,
            cookie: port.into(),
            inode: port.into(),
            drops: 0,
            queued,
            backlog,
        }
    }

    #[test]
    fn the_fullest_by_share_of_backlog_keep_series_and_the_rest_are_summed() {
        let all = vec![
            listener(80, 10, 4096), // 0.2% full
            listener(81, 3, 4),     // 75%
            listener(82, 0, 128),
            listener(83, 1, 1),    // full
            listener(84, 64, 128), // 50%
        ];
        let (kept, folded) = fullest(all, 3);
        let ports: Vec<u16> = kept.iter().map(|l| l.port).collect();
        assert_eq!(ports, [83, 81, 84]);
        assert_eq!(folded, Some(Folded { listeners: 2, queued: 10, backlog: 4096 + 128 }));
    }

    #[test]
    fn within_the_bound_nothing_is_folded_or_reordered() {
        let all = vec![listener(81, 0, 8), listener(80, 5, 8)];
        let (kept, folded) = fullest(all.clone(), 2);
        assert_eq!(kept.iter().map(|l| l.port).collect::<Vec<_>>(), [81, 80]);
        assert_eq!(folded, None);
    }
}
