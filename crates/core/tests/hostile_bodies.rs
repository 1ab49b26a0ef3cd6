//! Crafted bodies cannot take detection down or cost memory out of
//! proportion: for each hostile shape at 1 MB and 16 MB, the whole flow
//! (headers, the body read for the fingerprint and the tool-loop verdict)
//! runs, the request passes, the refusal is counted, and the memory the
//! flow allocates on top of the body itself stays under the body's size
//! plus 1 MiB (so with the body copy Envoy hands the VM: at most 2x the
//! body + 1 MiB); a long string inside content blocks, parsed into a value
//! tree first, is the worst case at 2x the body on top of it. Measured with
//! a counting allocator; the table is printed with `--nocapture`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)] // a test

use loopguard_core::config::Config;
use loopguard_core::flow::{Effect, Effects, Engine, Request, Step};
use loopguard_core::request::{RequestFacts, RequestHead};
use loopguard_core::state::store::InProcess;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = CURRENT.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                    + (new_size - layout.size());
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The counts are process-wide: the tests that measure run one at a time.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct NoFacts;

impl RequestFacts for NoFacts {
    fn header(&self, _: &str) -> Option<Vec<u8>> {
        None
    }
    fn source_address(&self) -> Option<String> {
        None
    }
    fn verified_claim(&self, _: &str, _: &str) -> Option<Vec<u8>> {
        None
    }
    fn route_name(&self) -> Option<String> {
        None
    }
    fn route_policy(&self) -> Option<String> {
        None
    }
}

/// loopguard reading the whole conversation: `similarity` (llm_tail or
/// near, with volatile-token masking) and tool loops (results, cycles,
/// answers).
fn engine(similarity: &str) -> Engine<InProcess> {
    let config = Config::parse(
        format!(r#"{{"max_body_bytes": 67108864, "policies": [{{"id": "agents", "spec": {{"selector": {{}},
            "loop_detection": {{"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "{similarity}"}},
            "tool_loops": {{"enabled": true, "answer_min": 3}}}}}}]}}"#).as_bytes(),
    )
    .unwrap();
    Engine::new(config, "t", |_| Ok(InProcess::default()), |_| None, 1).unwrap()
}

/// Units (comma-separated, `{i}` replaced by their index) up to about
/// `size` bytes inside `prefix`..`suffix`.
fn fill(prefix: &str, unit: &str, suffix: &str, size: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(size + unit.len() + 16);
    b.extend_from_slice(prefix.as_bytes());
    let mut i = 0;
    loop {
        let u = unit.replace("{i}", &i.to_string());
        if b.len() + u.len() + 1 + suffix.len() > size {
            break;
        }
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(u.as_bytes());
        i += 1;
    }
    b.extend_from_slice(suffix.as_bytes());
    b
}

fn hostile(kind: &str, size: usize) -> Vec<u8> {
    match kind {
        "empty objects" => fill(r#"{"model":"m","messages":["#, "{}", "]}", size),
        "deep nesting" => {
            let depth = size.saturating_sub(80) / 2;
            format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":{}{}}}]}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
            .into_bytes()
        }
        "tool calls" => fill(
            r#"{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":["#,
            r#"{"id":"c{i}","type":"function","function":{"name":"read_file_{i}","arguments":"{\"path\":\"/etc/{i}\"}"}}"#,
            "]}]}",
            size,
        ),
        "tool turns" => fill(
            r#"{"model":"m","messages":["#,
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"t{i}","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}"#,
            "]}",
            size,
        ),
        "many keys" => {
            let mut b = String::from(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#);
            let mut i = 0;
            while b.len() + 20 < size {
                b.push_str(&format!(",\"k{i}\":0"));
                i += 1;
            }
            b.push('}');
            b.into_bytes()
        }
        "one long string" => {
            let text = "a".repeat(size.saturating_sub(80));
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}}]}}"#)
                .into_bytes()
        }
        "numbers in a tool result" => {
            let numbers = fill("", "{i} ms", "", size.saturating_sub(300));
            let numbers = String::from_utf8(numbers).unwrap().replace(',', " ");
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"c","type":"function","function":{{"name":"t","arguments":"{{}}"}}}}]}},{{"role":"tool","tool_call_id":"c","content":"{numbers}"}}]}}"#).into_bytes()
        }
        "ids in an answer" => {
            let ids = fill(
                "",
                "req_{i}abcdefghij 2026-11-23T13:40:01Z",
                "",
                size.saturating_sub(200),
            );
            let ids = String::from_utf8(ids).unwrap().replace(',', " ");
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"go"}},{{"role":"assistant","content":"{ids}"}},{{"role":"user","content":"again"}}]}}"#).into_bytes()
        }
        "string in a block" => {
            let text = "a\\n".repeat(size.saturating_sub(120) / 3);
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"{text}"}}]}}]}}"#).into_bytes()
        }
        _ => unreachable!(),
    }
}

const KINDS: [&str; 9] = [
    "empty objects",
    "deep nesting",
    "tool calls",
    "tool turns",
    "many keys",
    "one long string",
    "numbers in a tool result",
    "ids in an answer",
    "string in a block",
];

/// Run a whole request through the flow; the step, the effects, and the
/// peak memory allocated on top of what was allocated before.
fn run(engine: &mut Engine<InProcess>, id: u32, body: &[u8]) -> (Step, Effects, usize) {
    let head = RequestHead {
        method: "POST",
        path: "/v1/chat/completions",
        authority: "",
    };
    let mut req = Request::new(id);
    let mut out = Effects::with_capacity(64);
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    engine.on_headers(&mut req, &head, &NoFacts, false, 1_000_000, &mut out);
    let step = engine.on_body(&mut req, body.len(), true, Some(body), 1_000_000, &mut out);
    let peak = PEAK.load(Ordering::Relaxed) - base;
    (step, out, peak)
}

fn counted(engine: &Engine<InProcess>, out: &Effects, name: &str) -> i64 {
    let defs = engine.registry().defs();
    out.iter()
        .filter_map(|e| match e {
            Effect::Count(id, n) if defs[id.0 as usize].0 == name => Some(*n),
            _ => None,
        })
        .sum()
}

#[test]
fn hostile_bodies_pass_bounded_and_detection_keeps_working() {
    let _one_at_a_time = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let mut id = 0;
    let mut rows = Vec::new();
    for (similarity, size) in [
        ("llm_tail", 1 << 20),
        ("llm_tail", 16 << 20),
        ("near", 1 << 20),
        ("near", 16 << 20),
    ] {
        let mut e = engine(similarity);
        for kind in KINDS {
            let body = hostile(kind, size);
            id += 1;
            let (step, out, peak) = run(&mut e, id, &body);
            let refused = ["too_deep", "too_many", "unparsed"]
                .iter()
                .map(|r| {
                    (
                        r,
                        counted(
                            &e,
                            &out,
                            &format!("loopguard.bodies_skipped_total.reason.{r}"),
                        ),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .map(|(r, _)| r.to_string())
                .collect::<Vec<_>>()
                .join(",");
            rows.push(format!(
                "{similarity:>8} {kind:>24} {:>6} KB: extra {:>8} KB ({:.2}x the body) {}",
                body.len() / 1024,
                peak / 1024,
                peak as f64 / body.len() as f64,
                if refused.is_empty() {
                    "read".to_string()
                } else {
                    format!("refused: {refused}")
                }
            ));
            assert_eq!(step, Step::Continue, "{kind} at {size}: the request passes");
            // A message of content blocks is parsed into a value tree (its
            // strings copied once) before it is normalised (once more): the
            // documented worst case, 2x the body on top of it.
            let allowed = if kind == "string in a block" {
                2 * body.len()
            } else {
                body.len()
            };
            assert!(
                peak <= allowed + (1 << 20),
                "{kind} at {} bytes allocated {peak} bytes on top of the body",
                body.len()
            );
            // A plain loop right after is still caught.
            let plain = br#"{"model":"m","messages":[{"role":"user","content":"same question"}]}"#;
            let steps: Vec<Step> = (0..3)
                .map(|_| {
                    id += 1;
                    run(&mut e, id, plain).0
                })
                .collect();
            assert_eq!(
                steps,
                [Step::Continue, Step::Continue, Step::Pause],
                "{kind}"
            );
            // Forget that loop for the next round (another window).
            e = engine(similarity);
        }
    }
    eprintln!("{}", rows.join("\n"));
}

/// loopguard in front of an MCP server: calls noted, then blocked.
fn mcp_engine() -> Engine<InProcess> {
    let config = Config::parse(
        br#"{"max_body_bytes": 67108864, "policies": [{"id": "tools", "spec": {"selector": {},
            "mcp": {"enabled": true, "ladder": ["block"]}}}]}"#,
    )
    .unwrap();
    Engine::new(config, "t", |_| Ok(InProcess::default()), |_| None, 1).unwrap()
}

fn mcp_call(arguments: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"search","arguments":{arguments}}}}}"#)
        .into_bytes()
}

fn mcp_request(kind: &str, size: usize) -> Vec<u8> {
    match kind {
        "a long argument" => mcp_call(&format!(
            r#"{{"q":"{}"}}"#,
            "a".repeat(size.saturating_sub(120))
        )),
        "nested arguments" => {
            let depth = size.saturating_sub(120) / 2;
            mcp_call(&format!("{}1{}", "[".repeat(depth), "]".repeat(depth)))
        }
        "many argument keys" => mcp_call(
            &String::from_utf8(fill("{", r#""k{i}":0"#, "}", size.saturating_sub(120))).unwrap(),
        ),
        "a batch" => fill(
            "[",
            r#"{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{"name":"search"}}"#,
            "]",
            size,
        ),
        _ => unreachable!(),
    }
}

/// One MCP exchange through the flow (the result in 64 KB chunks): the
/// step, the effects, and the peak memory on top of what was allocated
/// before, for the request and for the response.
fn mcp_run(
    e: &mut Engine<InProcess>,
    id: u32,
    body: &[u8],
    result: &[u8],
    sse: bool,
) -> (Step, Effects, usize, usize) {
    let head = RequestHead {
        method: "POST",
        path: "/mcp",
        authority: "",
    };
    let mut req = Request::new(id);
    let mut out = Effects::with_capacity(64);
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    e.on_headers(&mut req, &head, &NoFacts, false, 1_000_000, &mut out);
    let step = e.on_body(&mut req, body.len(), true, Some(body), 1_000_000, &mut out);
    let request_peak = PEAK.load(Ordering::Relaxed) - base;
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    if step == Step::Continue {
        e.on_response_headers(&mut req, Some(200), 1_000_000, &mut out);
        let ct = if sse {
            "text/event-stream"
        } else {
            "application/json"
        };
        e.on_response_content_type(&mut req, Some(ct), 1_000_000, &mut out);
        let chunks: Vec<&[u8]> = result.chunks(64 * 1024).collect();
        for (i, c) in chunks.iter().enumerate() {
            if !req.wants_response_body() {
                break;
            }
            e.on_response_body(&mut req, c, i + 1 == chunks.len(), 1_000_000, &mut out);
        }
    }
    let response_peak = PEAK.load(Ordering::Relaxed) - base;
    (step, out, request_peak, response_peak)
}

fn mcp_result(kind: &str, size: usize) -> (Vec<u8>, bool) {
    match kind {
        "a long result" => (
            format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{}"}}]}}}}"#, "a".repeat(size.saturating_sub(100)))
                .into_bytes(),
            false,
        ),
        "a nested result" => {
            let depth = size.saturating_sub(100) / 2;
            (format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":{}{}}}}}"#, "[".repeat(depth), "]".repeat(depth)).into_bytes(), false)
        }
        "a stream that never answers" => {
            let ping = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n";
            (ping.repeat(size / ping.len()).into_bytes(), true)
        }
        _ => unreachable!(),
    }
}

#[test]
fn hostile_mcp_traffic_passes_bounded_and_loops_are_still_stopped() {
    let _one_at_a_time = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let ok = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"same"}]}}"#;
    let mut rows = Vec::new();
    let mut id = 0;
    for size in [1 << 20, 16 << 20] {
        let mut cases: Vec<(String, Vec<u8>, Vec<u8>, bool)> = Vec::new();
        for kind in [
            "a long argument",
            "nested arguments",
            "many argument keys",
            "a batch",
        ] {
            cases.push((
                kind.to_string(),
                mcp_request(kind, size),
                ok.to_vec(),
                false,
            ));
        }
        for kind in [
            "a long result",
            "a nested result",
            "a stream that never answers",
        ] {
            let (result, sse) = mcp_result(kind, size);
            cases.push((kind.to_string(), mcp_call(r#"{"q":"x"}"#), result, sse));
        }
        for (kind, body, result, sse) in cases {
            let mut e = mcp_engine();
            id += 1;
            let (step, _, request_peak, response_peak) = mcp_run(&mut e, id, &body, &result, sse);
            rows.push(format!(
                "{kind:>28} {:>6} KB: request extra {:>7} KB ({:.2}x), response extra {:>5} KB",
                body.len().max(result.len()) / 1024,
                request_peak / 1024,
                request_peak as f64 / body.len() as f64,
                response_peak / 1024
            ));
            assert_eq!(step, Step::Continue, "{kind} at {size}: passes");
            // Arguments are parsed into a value and written out in
            // canonical JSON (then masked when opted in): at most 3x the
            // body on top of it. A result is never held: a bounded copy of
            // one member (64 KB) at most.
            assert!(
                request_peak <= 3 * body.len() + (1 << 20),
                "{kind}: {request_peak} on a {} byte body",
                body.len()
            );
            assert!(
                response_peak <= 1 << 20,
                "{kind}: {response_peak} on a {} byte result",
                result.len()
            );
            // A plain loop right after is still stopped at its 3rd call
            // (the ladder's only step, block, at the threshold).
            let plain = mcp_call(r#"{"q":"loop"}"#);
            let steps: Vec<Step> = (0..4)
                .map(|_| {
                    id += 1;
                    mcp_run(&mut e, id, &plain, ok, false).0
                })
                .collect();
            assert_eq!(
                steps,
                [Step::Continue, Step::Continue, Step::Pause, Step::Pause],
                "{kind}"
            );
        }
    }
    eprintln!("{}", rows.join("\n"));
}
