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
//! one that gets no body within [`HOLD_PROBE_MS`] is released and turns
//! holding off for this plugin instance (its configuration and Envoy's are
//! fixed together; a new configuration probes again). The released request
//! and every later one are then judged after their headers went upstream,
//! as without a buffer filter; the host logs why.

use super::delay_queue::DelayQueue;

/// How long a held request may wait for its first body callback before the
/// probe concludes Envoy will not deliver it. Envoy answers `Expect:
/// 100-continue` itself, so clients send the body right after the headers.
pub const HOLD_PROBE_MS: u64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// No held request has been seen through yet.
    Unconfirmed,
    /// A held request received its body: Envoy supports holding.
    Confirmed,
    /// A held request got no body in time: holding is off.
    Unsupported,
}

#[derive(Debug)]
pub struct HeaderHold {
    enabled: bool,
    probe: Probe,
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
            probe: Probe::Unconfirmed,
            watch: DelayQueue::default(),
            released: Vec::new(),
        }
    }

    /// Whether a request with a body should be held in the headers phase.
    pub fn holds(&self) -> bool {
        self.enabled && self.probe != Probe::Unsupported
    }

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

    /// A held request received a body callback. True if its headers are
    /// still held (not released by the probe), so loopguard may still
    /// change them.
    pub fn body_arrived(&mut self, stream: u32) -> bool {
        if let Some(i) = self.released.iter().position(|&s| s == stream) {
            self.released.swap_remove(i);
            return false;
        }
        self.watch.remove(stream);
        if self.probe == Probe::Unconfirmed {
            self.probe = Probe::Confirmed;
            // Every other watched request is held correctly too.
            self.watch = DelayQueue::default();
        }
        true
    }

    /// The watched requests that got no body by `now_ms`: released, and
    /// holding turned off.
    pub fn due(&mut self, now_ms: u64) -> Released {
        let streams = self.watch.take_due(now_ms);
        if streams.is_empty() {
            return Released::default();
        }
        let turned_off = self.probe == Probe::Unconfirmed;
        self.probe = Probe::Unsupported;
        // Nothing else is held from now on: release every watched request.
        let mut all = streams;
        all.extend(self.watch.take_due(u64::MAX));
        self.released.extend(all.iter().copied());
        Released {
            streams: all,
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
        let h = HeaderHold::new(false);
        assert!(!h.holds());
        assert!(HeaderHold::new(true).holds());
    }

    #[test]
    fn a_body_callback_confirms_and_stops_the_watch() {
        let mut h = HeaderHold::new(true);
        assert!(h.held(1, 0));
        assert!(h.held(2, 10));
        assert!(h.body_arrived(1));
        assert_eq!(h.probe(), Probe::Confirmed);
        assert!(!h.watching(), "confirmed: nothing is watched any more");
        // Later requests are not watched at all.
        assert!(!h.held(3, 20));
        assert_eq!(h.due(10_000), Released::default());
        assert!(h.holds());
        assert!(h.body_arrived(2));
        assert!(h.body_arrived(3));
    }

    #[test]
    fn no_body_in_time_releases_every_watched_request_and_turns_holding_off() {
        let mut h = HeaderHold::new(true);
        h.held(1, 0);
        h.held(2, 500);
        assert_eq!(h.due(HOLD_PROBE_MS - 1), Released::default());
        let r = h.due(HOLD_PROBE_MS);
        assert_eq!(
            r,
            Released {
                streams: vec![1, 2],
                turned_off: true
            }
        );
        assert!(!h.holds());
        assert_eq!(h.probe(), Probe::Unsupported);
        assert!(!h.watching());
        // A released request's late body callback: its headers are gone.
        assert!(!h.body_arrived(1));
        // Reported once.
        assert_eq!(h.due(u64::MAX), Released::default());
        assert!(!h.held(9, 0));
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
