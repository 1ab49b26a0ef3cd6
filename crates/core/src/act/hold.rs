//! Holding request headers until the body is judged
//! (`hold_request_headers`).
//!
//! With the Wasm filter's `allow_on_headers_stop_iteration: true` (Envoy
//! 1.35+), a filter that pauses in the request-headers phase still receives
//! the body, and the headers go upstream only when it continues. loopguard
//! then needs neither the buffer filter (the upstream never sees a request
//! it rejects) nor header_mutation (it adds warn headers to the request
//! itself).
//!
//! Without that Envoy setting the same pause stops the whole stream: no body
//! callback ever comes and the request would hang. A filter cannot read its
//! own `PluginConfig`, so this probe finds out: until one held request has
//! received a body callback (confirmed), every held request is watched, and
//! one that gets no body within [`HOLD_PROBE_MS`] is released (its headers
//! go upstream; it is judged after them, as without a buffer filter). After
//! [`MISSES_TO_STOP`] such releases with no confirmation in between, holding
//! stops for this plugin instance (the host logs why) and is tried again
//! after [`REPROBE_MS`], so one slow client cannot switch it off for good.
//! Once confirmed, nothing is watched: Envoy's setting and loopguard's
//! configuration change together, and a new configuration probes again.

use crate::act::delay_queue::DelayQueue;

/// How long a held request may wait for its first body callback before the
/// probe concludes Envoy will not deliver it. Envoy answers `Expect:
/// 100-continue` itself, so clients send the body right after the headers.
pub const HOLD_PROBE_MS: u64 = 1_000;
/// Released requests, with no confirmation in between, that stop holding.
pub const MISSES_TO_STOP: u32 = 3;
/// How long holding stays off before it is tried again.
pub const REPROBE_MS: u64 = 300_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Probe {
    /// No held request has been seen through yet.
    #[default]
    Unconfirmed,
    /// A held request received its body: Envoy supports holding.
    Confirmed,
    /// Held requests got no body in time: holding is off until the time
    /// given (ms).
    Unsupported { until_ms: u64 },
}

#[derive(Debug, Default)]
pub struct HeaderHold {
    enabled: bool,
    probe: Probe,
    /// Requests released since the last confirmation.
    misses: u32,
    /// Held requests waiting for their first body callback, while the
    /// probe is unconfirmed.
    watch: DelayQueue,
    /// Requests the probe released: their headers went upstream.
    released: Vec<u32>,
}

/// What the tick must do after [`HeaderHold::due`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Streams to resume.
    pub streams: Vec<u32>,
    /// The probe turned holding off just now (log it once).
    pub turned_off: bool,
}

impl HeaderHold {
    pub fn new(enabled: bool) -> Self {
        HeaderHold {
            enabled,
            ..HeaderHold::default()
        }
    }

    /// Whether a request with a body arriving at `now_ms` should be held in
    /// the headers phase.
    pub fn holds(&mut self, now_ms: u64) -> bool {
        if !self.enabled {
            return false;
        }
        if let Probe::Unsupported { until_ms } = self.probe {
            if now_ms < until_ms {
                return false;
            }
            self.probe = Probe::Unconfirmed;
            self.misses = 0;
        }
        true
    }

    #[cfg(test)]
    pub fn probe(&self) -> Probe {
        self.probe
    }

    /// A request was held in the headers phase at `now_ms`. True if the
    /// host must keep its tick running to watch it.
    pub fn held(&mut self, stream: u32, now_ms: u64) -> bool {
        if self.probe != Probe::Unconfirmed {
            return false;
        }
        self.watch
            .push(stream, now_ms.saturating_add(HOLD_PROBE_MS));
        true
    }

    /// A held request received a body callback (or, with no body, its
    /// trailers). True if its headers are still held (not released by the
    /// probe), so loopguard may still change them.
    pub fn body_arrived(&mut self, stream: u32) -> bool {
        if let Some(i) = self.released.iter().position(|&s| s == stream) {
            self.released.swap_remove(i);
            return false;
        }
        self.watch.remove(stream);
        if self.probe == Probe::Unconfirmed {
            self.probe = Probe::Confirmed;
            self.misses = 0;
            // Every other watched request is held correctly too.
            self.watch = DelayQueue::default();
        }
        true
    }

    /// The watched requests that got no body by `now_ms`: released; after
    /// [`MISSES_TO_STOP`] of them, holding stops (and every watched
    /// request is released).
    pub fn due(&mut self, now_ms: u64) -> Released {
        let mut streams = self.watch.take_due(now_ms);
        if streams.is_empty() {
            return Released::default();
        }
        self.misses = self
            .misses
            .saturating_add(u32::try_from(streams.len()).unwrap_or(u32::MAX));
        let turned_off = self.probe == Probe::Unconfirmed && self.misses >= MISSES_TO_STOP;
        if turned_off {
            self.probe = Probe::Unsupported {
                until_ms: now_ms.saturating_add(REPROBE_MS),
            };
            // Nothing else is held from now on.
            streams.extend(self.watch.take_due(u64::MAX));
        }
        self.released.extend(streams.iter().copied());
        Released {
            streams,
            turned_off,
        }
    }

    /// Whether anything waits for the tick.
    pub fn watching(&self) -> bool {
        !self.watch.is_empty()
    }

    /// A stream ended: forget it.
    pub fn forget(&mut self, stream: u32) {
        self.watch.remove(stream);
        self.released.retain(|&s| s != stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_configured() {
        assert!(!HeaderHold::new(false).holds(0));
        assert!(HeaderHold::new(true).holds(0));
    }

    #[test]
    fn a_body_callback_confirms_and_stops_the_watch() {
        let mut h = HeaderHold::new(true);
        assert!(h.held(1, 0));
        assert!(h.held(2, 10));
        assert!(h.body_arrived(1));
        assert_eq!(h.probe(), Probe::Confirmed);
        assert!(!h.watching(), "confirmed: nothing is watched any more");
        // Later requests are not watched at all, however slow.
        assert!(!h.held(3, 20));
        assert_eq!(h.due(10_000_000), Released::default());
        assert!(h.holds(10_000_000));
        assert!(h.body_arrived(2));
        assert!(h.body_arrived(3));
    }

    #[test]
    fn one_slow_request_is_released_but_holding_goes_on() {
        let mut h = HeaderHold::new(true);
        h.held(1, 0);
        h.held(2, 500);
        assert_eq!(h.due(HOLD_PROBE_MS - 1), Released::default());
        assert_eq!(
            h.due(HOLD_PROBE_MS),
            Released {
                streams: vec![1],
                turned_off: false
            }
        );
        assert!(h.holds(HOLD_PROBE_MS));
        assert!(h.watching(), "2 is still watched");
        // A released request's late body callback: its headers are gone.
        assert!(!h.body_arrived(1));
        // 2 gets its body: confirmed, the misses are forgotten.
        assert!(h.body_arrived(2));
        assert_eq!(h.probe(), Probe::Confirmed);
    }

    #[test]
    fn repeated_misses_turn_holding_off_then_it_is_tried_again() {
        let mut h = HeaderHold::new(true);
        for (i, stream) in [1, 2].into_iter().enumerate() {
            h.held(stream, 0);
            let r = h.due(HOLD_PROBE_MS + i as u64);
            assert_eq!((r.streams, r.turned_off), (vec![stream], false));
        }
        h.held(3, 10);
        h.held(4, 20);
        let r = h.due(HOLD_PROBE_MS + 10);
        assert_eq!(
            r,
            Released {
                streams: vec![3, 4],
                turned_off: true
            },
            "the third miss turns holding off and releases every watched request"
        );
        let off_at = HOLD_PROBE_MS + 10;
        assert_eq!(
            h.probe(),
            Probe::Unsupported {
                until_ms: off_at + REPROBE_MS
            }
        );
        assert!(!h.holds(off_at + 1));
        assert!(!h.held(9, off_at + 1));
        assert_eq!(h.due(u64::MAX), Released::default(), "reported once");
        // Later it probes again, from scratch.
        assert!(h.holds(off_at + REPROBE_MS));
        assert_eq!(h.probe(), Probe::Unconfirmed);
        assert!(h.held(10, off_at + REPROBE_MS));
        assert!(h.body_arrived(10));
        assert_eq!(h.probe(), Probe::Confirmed);
    }

    #[test]
    fn a_stream_that_ends_is_forgotten() {
        let mut h = HeaderHold::new(true);
        h.held(1, 0);
        h.forget(1);
        assert!(!h.watching());
        assert_eq!(h.due(u64::MAX), Released::default());
        assert_eq!(h.probe(), Probe::Unconfirmed, "no evidence either way");
        h.held(2, 0);
        h.due(u64::MAX);
        h.forget(2);
        assert!(h.released.is_empty());
    }
}
