//! One HTTP stream: Envoy's hooks become the core's events (with the
//! request's facts, read in place), and the core's effects become
//! callbacks. Nothing here decides: which policy applies, whether the body
//! is needed, what a store failure means, are the core's (`flow`), as in
//! `crates/filter/src/http.rs`.

use crate::abi::{self, Body, FilterPtr, HeaderMap};
use crate::effects::{self, At};
use crate::facts::Facts;
use crate::memory_store::Memory;
use crate::reentry::Running;
use crate::timer::{now_ms, TICK_EVENT};
use crate::worker::Worker;
use loopguard_core::host::{
    response_status, CallReply, Effects, Engine, HeaderBlock, Request, ResponseHead, Step,
};
use std::borrow::Cow;
use std::sync::Arc;

/// The event that resumes a paused stream (see [`Worker::resume`]).
pub const RESUME_EVENT: u64 = 2;

pub struct Stream {
    /// `None` when no engine could be made: everything passes.
    worker: Option<Arc<Worker>>,
    req: Request,
    pub filter: FilterPtr,
    /// A panic failed this stream: it is left alone from then on.
    pub failed: bool,
}

impl Stream {
    pub fn new(worker: Option<Arc<Worker>>, filter: FilterPtr) -> Stream {
        let id = worker.as_ref().map_or(0, |w| w.open_stream(filter));
        Stream {
            worker,
            req: Request::new(id),
            filter,
            failed: false,
        }
    }

    /// Feed the engine one event, carry out its effects (sending the store
    /// call it asks for, reporting relayed calls), and say what the
    /// request does next. The engine is locked for the event. A local reply
    /// is sent after the lock is given back, as the last thing done with
    /// this stream: Envoy may end and destroy the stream inside that call.
    /// `always`: run even for a stream a panic failed (its ending, a tick it
    /// carries for its worker).
    fn run(
        &mut self,
        in_request_body: bool,
        always: bool,
        event: impl FnOnce(&mut Engine<Memory>, &mut Request, &mut Effects) -> Step,
    ) -> Step {
        let Some(w) = self.worker.clone() else {
            return Step::Continue;
        };
        if (self.failed && !always) || Running::now() {
            // Re-entered from a callback of an event this thread runs: the
            // engine is busy (as a Wasm VM would be).
            return Step::Continue;
        }
        let now = now_ms();
        if w.needs_driver() && !self.failed {
            w.arm_tick(Some(self.req.id));
        }
        let me = self as *mut Stream as usize;
        let (step, reply) = {
            let mut guard = w.lock();
            let _running = Running::enter();
            let l = &mut *guard;
            let step = event(&mut l.engine, &mut self.req, &mut l.out);
            let at = At {
                stream: self.req.id,
                filter: Some(self.filter),
                in_request_body,
            };
            let settled = effects::settle(&w, l, at, now, Some(&mut self.req), step);
            l.out.clear();
            settled
        };
        if step == Step::Pause && w.ticking() {
            // Resumed by a tick, maybe on the main thread: its scheduler
            // is made now, on its own thread.
            w.can_resume(self.req.id);
        }
        for ended in Running::ended_meanwhile() {
            // SAFETY (another stream): a live stream of this thread whose
            // ending Envoy delivered inside this event (destroy hooks are
            // never nested in an event).
            if ended == me {
                self.on_complete();
            } else if let Some(other) = unsafe { (ended as *mut Stream).as_mut() } {
                other.on_complete();
            }
        }
        if let Some((reply, details)) = reply {
            abi::send_response(self.filter, &reply, details);
            return Step::Pause;
        }
        step
    }

    pub fn on_request_headers(&mut self, end_of_stream: bool) -> Step {
        // SAFETY: the slices are read in this hook, before any change.
        let pairs = unsafe { abi::headers(self.filter, HeaderMap::Request) };
        let headers = HeaderBlock::from_pairs(pairs);
        #[cfg(feature = "fault-injection")]
        crate::faults::on_request(&headers);
        let facts = Facts {
            filter: self.filter,
            headers: &headers,
        };
        let line = headers.request_line();
        let head = line.head();
        let now = now_ms();
        self.run(false, false, |e, r, out| {
            e.on_headers(r, &head, &facts, end_of_stream, now, out)
        })
    }

    pub fn on_request_body(&mut self, end_of_stream: bool) -> Step {
        // The whole body so far: what Envoy buffered for us plus the chunk
        // at hand, unless the chunk is an earlier filter's whole buffer.
        let whole_in_chunk = abi::received_buffered_request_body(self.filter);
        let received = abi::body_size(self.filter, Body::ReceivedRequest);
        let size = if whole_in_chunk {
            received
        } else {
            received + abi::body_size(self.filter, Body::BufferedRequest)
        };
        let body = self.req.wants_body(size, end_of_stream).then(|| {
            // SAFETY: read in this hook, before any change to the body.
            let mut chunks = unsafe {
                if whole_in_chunk {
                    abi::body_chunks(self.filter, Body::ReceivedRequest)
                } else {
                    let mut c = abi::body_chunks(self.filter, Body::BufferedRequest);
                    c.extend(abi::body_chunks(self.filter, Body::ReceivedRequest));
                    c
                }
            };
            joined(&mut chunks)
        });
        let now = now_ms();
        self.run(true, false, |e, r, out| {
            e.on_body(r, size, end_of_stream, body.as_deref(), now, out)
        })
    }

    pub fn on_request_trailers(&mut self) -> Step {
        let body = self.req.wants_body_at_trailers().then(|| {
            // SAFETY: read in this hook, before any change to the body.
            let mut chunks = unsafe { abi::body_chunks(self.filter, Body::BufferedRequest) };
            joined(&mut chunks).into_owned()
        });
        let now = now_ms();
        self.run(false, false, |e, r, out| {
            e.on_trailers(r, body.as_deref(), now, out)
        })
    }

    pub fn on_response_headers(&mut self) {
        let status = abi::header(self.filter, HeaderMap::Response, ":status")
            .and_then(|s| response_status(&s));
        let head: Vec<Option<String>> = if self.req.wants_content_type() {
            self.req
                .response_headers_wanted()
                .iter()
                .map(|name| {
                    abi::header(self.filter, HeaderMap::Response, name)
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                })
                .collect()
        } else {
            Vec::new()
        };
        let now = now_ms();
        self.run(false, false, |e, r, out| {
            e.on_response_headers(r, status, now, out);
            if r.wants_content_type() {
                let head = ResponseHead::of(&head);
                e.on_response_head(r, &head, now, out);
            }
            Step::Continue
        });
    }

    /// A response body chunk; [`Step::Pause`]: the last one waits until
    /// the shared store has the response's spending.
    pub fn on_response_body(&mut self, end_of_stream: bool) -> Step {
        if !self.req.wants_response_body() {
            return Step::Continue;
        }
        // Each chunk passes on at once; it is read in place.
        // SAFETY: read in this hook, before any change to the body.
        let mut chunks = unsafe { abi::body_chunks(self.filter, Body::ReceivedResponse) };
        let chunk = joined(&mut chunks);
        let now = now_ms();
        self.run(false, false, |e, r, out| {
            e.on_response_body(r, &chunk, end_of_stream, now, out)
        })
    }

    /// The stream ended (answered, or its client left).
    pub fn on_complete(&mut self) {
        self.run(false, true, |e, r, out| {
            e.on_done(r, out);
            Step::Continue
        });
    }

    /// The answer to this stream's store call: what goes on, if anything,
    /// is resumed (the request, or the response whose end waited for it).
    pub fn on_store_reply(&mut self, callout: u64, reply: CallReply) {
        let Ok(token) = u32::try_from(callout) else {
            return;
        };
        let now = now_ms();
        let response = self.req.response_held();
        if self.run(false, false, |e, r, out| {
            e.on_store_reply(r, token, &reply, now, out)
        }) == Step::Continue
        {
            abi::resume(self.filter, response);
        }
    }

    /// A scheduled event: the tick (this stream drives its worker's), or
    /// this stream's resumption.
    pub fn on_scheduled(&mut self, event: u64) {
        match event {
            TICK_EVENT => {
                let now = now_ms();
                self.run(false, true, |e, _, out| {
                    e.on_tick(now, out);
                    Step::Continue
                });
            }
            RESUME_EVENT if !self.failed => abi::resume(self.filter, false),
            _ => {}
        }
    }

    /// Envoy destroys the stream: what the engine gave the request is
    /// dropped under the engine's lock.
    pub fn close(&mut self) {
        if let Some(w) = &self.worker {
            let id = self.req.id;
            let req = std::mem::replace(&mut self.req, Request::new(0));
            w.close_stream(id, move || drop(req));
        }
    }
}

/// One slice as it is, several joined into one copy.
fn joined<'a>(chunks: &mut Vec<&'a [u8]>) -> Cow<'a, [u8]> {
    match chunks.len() {
        0 => Cow::Borrowed(&[]),
        1 => Cow::Borrowed(chunks.swap_remove(0)),
        _ => Cow::Owned(chunks.concat()),
    }
}
