//! The Lua that runs in Redis and the core's record arithmetic agree.
//!
//! Random sequences of hits, near hits and take-backs run through three
//! lanes: the library loaded as a Redis Function (`FCALL`, one node), the
//! same library as the script a Redis Cluster runs (`EVALSHA`, and `EVAL`
//! when the node answers `NOSCRIPT`), and the core's local store (the slot
//! table) fed the very times Redis stamped each hit with. Every answer of
//! each Redis lane is compared with the core's; the two Redis lanes are
//! also compared with each other wherever their times did not straddle a
//! boundary.
//!
//! Budgets likewise: random adds and checks of several keys, at times that
//! step over slice boundaries and window edges, run through
//! `loopguard_budget` in both forms and through the core's slices
//! (`state::budget::Slices`); every total and wait must be the same, for
//! windows of a minute to 30 days. A group of 8 keys (a request's most
//! caps) goes through Redis and the core's budget table alike.
//!
//! It needs `redis-server` (Debian's `redis-server`, 7.0+). Without it the
//! test says so and passes, unless `LOOPGUARD_REQUIRE_REDIS=1`, which
//! `make test` sets: then it fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unreachable
)] // a test

use loopguard_core::detect::fingerprint::Fingerprint;
use loopguard_core::detect::similarity::{NearThreshold, Signature};
use loopguard_core::state::budget::{slice_ms, Add, Added, BudgetTable, Slices, SLICES};
use loopguard_core::state::near::NearProbe;
use loopguard_core::state::redis::{self, BudgetKey, Call, Script};
use loopguard_core::state::slot_table::{Bucket, Record, TableLayout};
use loopguard_core::state::store::{
    BucketBackend, CasWrite, Hit, InProcess, SlotStore, StoreAnswer, TakeBack,
};
use loopguard_core::state::window::{Forgave, Forgiveness, WindowQuery, WindowState};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// --- a Redis of the test's own, and a RESP connection to it --------------------------

#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Resp>),
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// A real redis-server with the shipped library loaded, and a connection
/// to it (the server stops when dropped); `None` where redis-server is not
/// installed and not required.
fn loaded_server() -> Option<(Server, Conn)> {
    let server = Server::start()?;
    let mut conn = Conn::open(server.port);
    let loaded = conn.cmd(&["FUNCTION", "LOAD", "REPLACE", redis::script::LIBRARY]);
    assert_eq!(loaded, Resp::Bulk(Some("loopguard".into())));
    Some((server, conn))
}

impl Conn {
    fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to redis");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Conn {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    fn cmd<S: AsRef<str>>(&mut self, parts: &[S]) -> Resp {
        let mut out = format!("*{}\r\n", parts.len()).into_bytes();
        for p in parts {
            let p = p.as_ref().as_bytes();
            out.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
            out.extend_from_slice(p);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out).unwrap();
        self.read()
    }

    fn read(&mut self) -> Resp {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let (kind, rest) = line.trim_end().split_at(1);
        match kind {
            "+" => Resp::Simple(rest.to_string()),
            "-" => Resp::Error(rest.to_string()),
            ":" => Resp::Int(rest.parse().unwrap()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Resp::Bulk(None);
                }
                let mut buf = vec![0; usize::try_from(n).unwrap() + 2];
                self.reader.read_exact(&mut buf).unwrap();
                buf.truncate(buf.len() - 2);
                Resp::Bulk(Some(String::from_utf8(buf).unwrap()))
            }
            "*" => {
                let n: i64 = rest.parse().unwrap();
                Resp::Array((0..n.max(0)).map(|_| self.read()).collect())
            }
            _ => panic!("unreadable RESP line {line:?}"),
        }
    }

    /// Redis's clock, in milliseconds.
    fn time_ms(&mut self) -> u64 {
        let Resp::Array(t) = self.cmd(&["TIME"]) else {
            panic!("TIME")
        };
        let num = |r: &Resp| match r {
            Resp::Bulk(Some(s)) => s.parse::<u64>().unwrap(),
            other => panic!("{other:?}"),
        };
        num(&t[0]) * 1000 + num(&t[1]) / 1000
    }
}

struct Server {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Server {
    fn start() -> Option<Server> {
        let present = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !present {
            assert!(
                std::env::var("LOOPGUARD_REQUIRE_REDIS").as_deref() != Ok("1"),
                "redis-server is not installed, and LOOPGUARD_REQUIRE_REDIS=1"
            );
            eprintln!("redis_agreement: redis-server not found; not run");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("loopguard-agreement-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let server = Server { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// --- the lanes ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    Function,
    Script,
}

/// One way of running the library, with the core's table beside it.
struct Lane {
    how: How,
    namespace: &'static str,
    core: SlotStore<InProcess>,
    /// `NOSCRIPT` answers seen (the script lane).
    noscripts: u32,
    /// When each record last had a detection.
    last_detection: std::collections::HashMap<Fingerprint, u64>,
    /// Suppressed counts Redis had forgotten after a quiet spell.
    forgotten: u32,
}

impl Lane {
    fn new(how: How, namespace: &'static str) -> Lane {
        Lane {
            how,
            namespace,
            core: SlotStore {
                layout: TableLayout::new(4096),
                backend: InProcess::default(),
            },
            noscripts: 0,
            last_detection: Default::default(),
            forgotten: 0,
        }
    }

    /// Send a call as loopguard would for this lane.
    fn send(&mut self, conn: &mut Conn, script: &Script, call: &Call) -> Resp {
        let n = call.keys.len().to_string();
        let mut parts: Vec<&str> = match self.how {
            How::Function => vec!["FCALL", call.entry.name(), &n],
            How::Script => vec!["EVALSHA", &script.sha1, &n],
        };
        parts.extend(call.keys.iter().map(String::as_str));
        if self.how == How::Script {
            parts.push(call.entry.name());
        }
        parts.extend(call.args.iter().map(String::as_str));
        let reply = conn.cmd(&parts);
        match (&reply, self.how) {
            (Resp::Error(e), How::Script) if e.starts_with("NOSCRIPT") => {
                self.noscripts += 1;
                parts[0] = "EVAL";
                parts[1] = &script.source;
                conn.cmd(&parts)
            }
            _ => reply,
        }
    }
}

fn state_of(reply: &Resp) -> WindowState {
    let Resp::Array(items) = reply else {
        panic!("not a window state: {reply:?}")
    };
    let n = |i: usize| match items[i] {
        Resp::Int(v) => v,
        ref other => panic!("element {i}: {other:?}"),
    };
    WindowState {
        count: u32::try_from(n(0)).unwrap(),
        until_allowed_ms: u64::try_from(n(1)).unwrap(),
        cooldown_remaining_ms: u64::try_from(n(2)).unwrap(),
        event: u32::try_from(n(3)).ok(),
    }
}

/// What an answer decides: the count, the event, and whether a wait and a
/// cooldown are running.
fn shape(s: &WindowState) -> (u32, Option<u32>, bool, bool) {
    (
        s.count,
        s.event,
        s.until_allowed_ms > 0,
        s.cooldown_remaining_ms > 0,
    )
}

fn forgave_of(reply: &Resp) -> Forgave {
    match reply {
        Resp::Int(1) => Forgave::Forgiven,
        Resp::Int(0) => Forgave::OverBudget,
        Resp::Int(-1) => Forgave::NotFound,
        other => panic!("not a take-back answer: {other:?}"),
    }
}

/// The time Redis stamped the hit logged as `nonce` with (its score).
fn stamp_of(conn: &mut Conn, log_key: &str, nonce: &str) -> u64 {
    let Resp::Array(entries) = conn.cmd(&["ZRANGE", log_key, "0", "-1", "WITHSCORES"]) else {
        panic!("ZRANGE")
    };
    for pair in entries.chunks(2) {
        let (Resp::Bulk(Some(member)), Resp::Bulk(Some(score))) = (&pair[0], &pair[1]) else {
            continue;
        };
        let rest = member.split_once(':').map_or("", |(_, r)| r);
        if rest == nonce || rest.starts_with(&format!("{nonce}:")) {
            return score.parse().unwrap();
        }
    }
    panic!("the hit {nonce} is not in {log_key}")
}

// --- random sequences ------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

fn query(rng: &mut Rng) -> WindowQuery {
    let capacity = u32::try_from(rng.range(1, 8)).unwrap();
    let trip_at = u32::try_from(rng.range(1, u64::from(capacity) + 1)).unwrap();
    WindowQuery {
        window_ms: rng.range(60, 400),
        capacity,
        trip_at,
        cooldown_ms: if rng.below(2) == 0 {
            0
        } else {
            rng.range(50, 300)
        },
        detect_at: u32::try_from(rng.range(1, u64::from(trip_at))).unwrap(),
        event_every_ms: rng.range(0, 300),
    }
}

/// A signature from a small family, so that some hits are near and some
/// are not: two anchors, a payload or none, bins with a few flipped.
fn signature(rng: &mut Rng) -> Signature {
    let mut bins = [0x5555_aaaa_0f0f_3c3c_u64; 6];
    for _ in 0..rng.below(40) {
        let w = usize::try_from(rng.below(6)).unwrap();
        bins[w] ^= 1 << rng.below(64);
    }
    Signature {
        anchor: [0x0102_0304, 0x0a0b_0c0d][usize::try_from(rng.below(2)).unwrap()],
        payload: [0, 0, 7][usize::try_from(rng.below(3)).unwrap()],
        bins,
    }
}

/// A hit made in a lane: what taking it back needs.
#[derive(Clone)]
struct Made {
    hit: Hit,
    nonce: String,
    at: u64,
}

#[derive(Debug, Default)]
struct Tally {
    hits: u32,
    take_backs: u32,
    lanes_compared: u32,
    lanes_straddled: u32,
    /// Event states with suppressed detections Redis had let expire.
    forgotten: u32,
    noscripts: u32,
}

/// Clear the event state of `key`'s record in the core's table (as Redis's
/// event key expires): whether there was any to forget.
fn forget_events(core: &mut SlotStore<InProcess>, key: &Fingerprint) -> bool {
    let bucket = core.layout.bucket_of(key);
    let Some((bytes, version)) = core.backend.read(bucket) else {
        return false;
    };
    let Some(mut decoded) = Bucket::decode(&bytes) else {
        return false;
    };
    let mut had = false;
    for e in decoded.entries.iter_mut().filter(|e| e.fingerprint == *key) {
        match &mut e.record {
            Record::Hits(r) => {
                had = r.suppressed > 0;
                r.last_event = 0;
                r.suppressed = 0;
            }
            Record::Near(r) => {
                had = r.events.iter().any(|e| e.suppressed > 0);
                r.events.clear();
            }
        }
    }
    assert_eq!(
        core.backend.write(bucket, &decoded.encode(), version),
        CasWrite::Written
    );
    had
}

/// Run one lane's step: a hit. Returns Redis's answer after checking it
/// against the core's.
fn hit_in(
    lane: &mut Lane,
    conn: &mut Conn,
    script: &Script,
    hit: &Hit,
    nonce: String,
    made: &mut Vec<Made>,
) -> (WindowState, WindowState) {
    let call = redis::hit_call(lane.namespace, hit, &nonce);
    let reply = lane.send(conn, script, &call);
    let got = state_of(&reply);
    let at = stamp_of(conn, &call.keys[0], &nonce);
    // Redis keeps a record's event state for the longer of the window and
    // the event interval after its last detection (the key's expiry: gone
    // once that much time has passed, not at the very millisecond); the
    // table keeps it as long as the record. That is the one difference:
    // after such a quiet spell the core's record forgets its event state
    // too, and from there every answer must agree.
    let q = &hit.query;
    let quiet = lane
        .last_detection
        .get(&hit.key)
        .is_some_and(|&t| at - t > q.event_every_ms.max(q.window_ms));
    if quiet {
        lane.forgotten += u32::from(forget_events(&mut lane.core, &hit.key));
    }
    let timed = Hit { now_ms: at, ..*hit };
    let StoreAnswer::Ready(core) = lane.core.record(&timed) else {
        panic!("the core's table failed")
    };
    let expected = core.state;
    if core.state.count >= q.detect_at || core.state.cooldown_remaining_ms > 0 {
        lane.last_detection.insert(hit.key, at);
    }
    assert_eq!(
        got, expected,
        "{:?} lane: Redis and the core disagree on {hit:?} at {at}",
        lane.how
    );
    made.push(Made {
        hit: timed,
        nonce,
        at,
    });
    (got, core.state)
}

/// Run one lane's step: a take-back. Redis's clock is read just before and
/// just after; the core must give Redis's answer at one of those times.
fn take_back_in(lane: &mut Lane, conn: &mut Conn, script: &Script, of: &Made, max: u32) -> Forgave {
    let t = TakeBack {
        key: of.hit.key,
        at: of.at,
        near: of.hit.near.map(|p| p.signature),
        id: 0,
        forgiveness: Forgiveness {
            window_ms: of.hit.query.window_ms,
            max,
        },
    };
    let call = redis::take_back_call(lane.namespace, &t, &of.nonce);
    let before = conn.time_ms();
    let got = forgave_of(&lane.send(conn, script, &call));
    let after = conn.time_ms();
    let snapshot = lane.core.backend.clone();
    for now in [before, after] {
        lane.core.backend = snapshot.clone();
        if lane.core.take_back(&t, now) == Ok(got) {
            return got;
        }
    }
    panic!(
        "{:?} lane: Redis answered {got:?} to taking back {} (at {}), the core did not at {before}..{after}",
        lane.how, of.nonce, of.at
    )
}

#[test]
fn the_function_the_script_and_the_core_give_the_same_answers() {
    let Some((_server, mut conn)) = loaded_server() else {
        return;
    };
    let script = Script::shipped();
    // The script is not cached yet: the first call answers NOSCRIPT.
    assert_eq!(
        conn.cmd(&["SCRIPT", "EXISTS", &script.sha1]),
        Resp::Array(vec![Resp::Int(0)])
    );

    let mut tally = Tally::default();
    for case in 0..18u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (case + 1).wrapping_mul(0x1000_0001));
        let mut lanes = [Lane::new(How::Function, "fn"), Lane::new(How::Script, "sc")];
        let q = query(&mut rng);
        let near_mode = case % 3 == 2;
        let keys = [
            Fingerprint([case as u8; 16]),
            Fingerprint([0x80 | case as u8; 16]),
        ];
        let mut made: [Vec<Made>; 2] = [Vec::new(), Vec::new()];
        for step in 0..40 {
            let roll = rng.below(10);
            if roll < 7 || made[0].is_empty() {
                let near = near_mode.then(|| NearProbe {
                    signature: signature(&mut rng),
                    threshold: NearThreshold {
                        min_matches: u32::try_from(rng.range(150, 192)).unwrap(),
                    },
                });
                let hit = Hit {
                    key: keys[usize::try_from(rng.below(2)).unwrap()],
                    now_ms: 0,
                    query: q,
                    near,
                    id: 0,
                };
                let mut answers = Vec::new();
                for (i, lane) in lanes.iter_mut().enumerate() {
                    let nonce = format!("c{case}s{step}");
                    answers.push(hit_in(lane, &mut conn, &script, &hit, nonce, &mut made[i]));
                }
                tally.hits += 1;
                // Where the core answers both lanes alike, so must Redis.
                // The lanes run a few hundred microseconds apart, so the
                // milliseconds left are compared as running or not.
                let ([(fn_redis, fn_core), (sc_redis, sc_core)], _) = answers.split_at(2) else {
                    unreachable!()
                };
                if shape(fn_core) == shape(sc_core) {
                    assert_eq!(
                        shape(fn_redis),
                        shape(sc_redis),
                        "the function and the script differ"
                    );
                    tally.lanes_compared += 1;
                } else {
                    tally.lanes_straddled += 1;
                }
            } else if roll < 9 {
                let pick = usize::try_from(rng.below(made[0].len() as u64)).unwrap();
                let max = u32::try_from(rng.range(0, 3)).unwrap();
                for (i, lane) in lanes.iter_mut().enumerate() {
                    let of = made[i][pick].clone();
                    take_back_in(lane, &mut conn, &script, &of, max);
                }
                tally.take_backs += 1;
            } else {
                // Let windows, cooldowns and event intervals run out.
                std::thread::sleep(Duration::from_millis(rng.range(50, 250)));
            }
            // Hits of one lane never share a millisecond, so each is found
            // by its time in the core's log as by its nonce in Redis's.
            std::thread::sleep(Duration::from_millis(rng.range(2, 12)));
        }
        assert_eq!(lanes[0].noscripts, 0);
        tally.noscripts += lanes[1].noscripts;
        tally.forgotten += lanes.iter().map(|l| l.forgotten).sum::<u32>();
    }
    eprintln!("redis_agreement: {tally:?}");
    assert!(
        tally.noscripts == 1,
        "the script lane met NOSCRIPT once: {tally:?}"
    );
    assert!(tally.hits >= 350 && tally.take_backs >= 60, "{tally:?}");
    assert!(
        tally.lanes_compared * 10 >= tally.hits * 9,
        "too few hits compared across lanes: {tally:?}"
    );
    assert_eq!(
        conn.cmd(&["SCRIPT", "EXISTS", &script.sha1]),
        Resp::Array(vec![Resp::Int(1)]),
        "the first EVALSHA's NOSCRIPT was answered with EVAL, which cached it"
    );
}

// --- budgets ---------------------------------------------------------------------------

/// Redis's answer to a budget call: each key's total and wait.
fn budget_answer(reply: &Resp) -> Vec<(u64, u64)> {
    let Resp::Array(items) = reply else {
        panic!("not a budget answer: {reply:?}")
    };
    let n = |r: &Resp| match r {
        Resp::Int(v) => u64::try_from(*v).unwrap(),
        other => panic!("not a count: {other:?}"),
    };
    assert_eq!(items.len() % 2, 0, "{reply:?}");
    items.chunks(2).map(|p| (n(&p[0]), n(&p[1]))).collect()
}

/// A budget key's hash in Redis: slice number -> amount, sorted.
fn budget_hash(conn: &mut Conn, key: &str) -> Vec<(u64, u64)> {
    let Resp::Array(fields) = conn.cmd(&["HGETALL", key]) else {
        panic!("HGETALL")
    };
    let mut out: Vec<(u64, u64)> = fields
        .chunks(2)
        .map(|p| match (&p[0], &p[1]) {
            (Resp::Bulk(Some(f)), Resp::Bulk(Some(v))) => {
                // Absolute slice numbers, in plain decimal.
                assert_eq!(f, &f.parse::<u64>().unwrap().to_string());
                (f.parse().unwrap(), v.parse().unwrap())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    out.sort_unstable();
    out
}

/// A 30-day window, and the longest a budget may have (31 days).
const THIRTY_DAYS_MS: u64 = 30 * 86_400_000;
const LONGEST_WINDOW_MS: u64 = 31 * 86_400_000;

#[derive(Debug, Default)]
struct BudgetTally {
    calls: u32,
    checks: u32,
    waits: u32,
    on_boundaries: u32,
    skewed: u32,
    noscripts: u32,
    windows_emptied: u32,
    /// Answers for keys of a 30-day window or longer, and ones of those
    /// over their cap.
    long_windows: u32,
    long_waits: u32,
    /// The most slices a key held, and answers from keys holding 40 or more.
    most_slices: usize,
    many_slices: u32,
}

/// The time of the next call: moving forward by a random step, onto a
/// slice boundary or a millisecond before one, to the moment a key's
/// oldest slice leaves the window (or one before), or past a whole window.
/// `dense`: mostly small steps, so a key holds many slices.
fn next_now(
    rng: &mut Rng,
    now: u64,
    s: u64,
    oldest: Option<u64>,
    dense: bool,
    tally: &mut BudgetTally,
) -> u64 {
    // Dense: no jump past a whole window.
    let roll = match (dense, rng.below(25)) {
        (false, _) => rng.below(12),
        (true, 0) => rng.below(11),
        (true, _) => [0, 4, 5][usize::try_from(rng.below(3)).unwrap()],
    };
    match roll {
        0..=3 => now + rng.below(s / 4 + 1),
        4 => {
            tally.on_boundaries += 1;
            (now / s + 1) * s
        }
        5 => {
            tally.on_boundaries += 1;
            ((now / s + 1) * s - 1).max(now)
        }
        6..=8 => now + s * rng.range(1, 10) + rng.below(s),
        9 | 10 => match oldest {
            Some(i) => {
                tally.on_boundaries += 1;
                ((i + SLICES) * s - rng.below(2)).max(now)
            }
            None => now + s,
        },
        _ => now + (SLICES + 1) * s + rng.below(s),
    }
}

#[test]
fn budgets_in_redis_are_the_core_s_slices() {
    let Some((_server, mut conn)) = loaded_server() else {
        return;
    };
    let script = Script::shipped();

    let mut tally = BudgetTally::default();
    for case in 0..24u64 {
        let mut rng = Rng(0x5851_f42d_4c95_7f2d ^ (case + 1).wrapping_mul(0x2545_f491));
        let mut lanes = [
            Lane::new(How::Function, "bfn"),
            Lane::new(How::Script, "bsc"),
        ];
        let caller = rng.next();
        let n = usize::try_from(rng.range(1, 4)).unwrap();
        // Slices of real windows (60 s .. 30 days): at least a second, so
        // no key expires in Redis while the test runs. The first key of
        // every fourth case (but the dense ones) has a 30-day window.
        let mut keys: Vec<BudgetKey> = (0..n)
            .map(|k| BudgetKey {
                key: rng.next() ^ k as u64,
                slice_ms: match rng.below(4) {
                    _ if k == 0 && case % 4 == 3 && case % 3 != 1 => slice_ms(THIRTY_DAYS_MS),
                    0 => 1_000,
                    1 => slice_ms(3_600_000),
                    2 => slice_ms(86_400_000),
                    _ => rng.range(1_000, 30_000),
                },
                add: 0,
                cap: 0,
            })
            .collect();
        // Some amounts near what Lua still counts exactly.
        let big = case % 6 == 5;
        let unit = if big { 1 << 40 } else { rng.range(1, 1_000) };
        let caps: Vec<u64> = keys
            .iter()
            .map(|_| match rng.below(5) {
                0 => 0,
                _ => unit * rng.range(1, 40),
            })
            .collect();
        // From near 0 (the window's first slice saturates at 0), or a
        // wall-clock time.
        let mut now = if case % 4 == 0 {
            rng.below(5_000)
        } else {
            1_700_000_000_000 + rng.below(1 << 32)
        };
        let mut models = vec![vec![Slices::default(); n]; lanes.len()];
        let dense = case % 3 == 1;
        for step in 0..(if dense { 400 } else { 120 }) {
            // Steps of a random key's slices; dense: of the shortest.
            let pick = if dense {
                (0..n).min_by_key(|&k| keys[k].slice_ms).unwrap()
            } else {
                usize::try_from(rng.below(n as u64)).unwrap()
            };
            let s = keys[pick].slice_ms;
            let oldest = models[0][pick].spent.iter().map(|&(i, _)| i).min();
            now = next_now(&mut rng, now, s, oldest, dense, &mut tally);
            // Now and then a writer whose clock is behind or ahead (by up
            // to more than a window): the base clock does not move. One
            // ahead drops the slices before its window, so a dense case
            // meets one only at its start (and then holds a slice past the
            // base clock's, and keeps the newest 60).
            let at = match rng.below(14) {
                1 if dense && step >= 20 => now,
                0 => {
                    tally.skewed += 1;
                    now.saturating_sub(rng.range(0, SLICES + 10) * s + rng.below(s))
                }
                1 => {
                    tally.skewed += 1;
                    now + rng.range(0, SLICES + 10) * s + rng.below(s)
                }
                _ => now,
            };
            let check_only = rng.below(3) == 0;
            for (k, key) in keys.iter_mut().enumerate() {
                key.cap = caps[k];
                key.add = if check_only || rng.below(4) == 0 {
                    0
                } else {
                    rng.range(1, 2 * unit)
                };
            }
            tally.calls += 1;
            tally.checks += u32::from(check_only);
            for (lane, model) in lanes.iter_mut().zip(models.iter_mut()) {
                let call = redis::budget_call(lane.namespace, caller, &keys, at);
                let reply = lane.send(&mut conn, &script, &call);
                let got = budget_answer(&reply);
                let expected: Vec<(u64, u64)> = keys
                    .iter()
                    .zip(model.iter_mut())
                    .map(|(key, slices)| {
                        // Everything the key had spent has left the window.
                        if !slices.spent.is_empty() && slices.total(at, key.slice_ms) == 0 {
                            tally.windows_emptied += 1;
                        }
                        slices.add(at, key.add, at, key.slice_ms);
                        let total = slices.total(at, key.slice_ms);
                        tally.most_slices = tally.most_slices.max(slices.spent.len());
                        if key.slice_ms >= slice_ms(THIRTY_DAYS_MS) {
                            tally.long_windows += 1;
                            tally.long_waits +=
                                u32::from(slices.until_below(key.cap, at, key.slice_ms) > 0);
                        }
                        tally.many_slices += u32::from(slices.spent.len() >= 40);
                        (total, slices.until_below(key.cap, at, key.slice_ms))
                    })
                    .collect();
                assert_eq!(
                    got, expected,
                    "{:?} lane, case {case}: Redis and the core disagree at {at} on {keys:?}",
                    lane.how
                );
                tally.waits += u32::try_from(got.iter().filter(|(_, w)| *w > 0).count()).unwrap();
                // webdis's JSON of the same answer reads the same.
                let json = format!(
                    r#"{{"FCALL":[{}]}}"#,
                    got.iter()
                        .map(|(t, w)| format!("{t},{w}"))
                        .collect::<Vec<_>>()
                        .join(",")
                );
                assert_eq!(
                    redis::budget_answer(Some("200"), json.as_bytes(), n),
                    Ok(got)
                );
                // Redis keeps exactly the core's slices, and expires a key
                // a slice after its window.
                for ((store_key, key), slices) in call.keys.iter().zip(&keys).zip(model.iter()) {
                    let mut kept = slices.spent.clone();
                    kept.sort_unstable();
                    assert_eq!(
                        budget_hash(&mut conn, store_key),
                        kept,
                        "{:?} lane",
                        lane.how
                    );
                    let Resp::Int(ttl) = conn.cmd(&["PTTL", store_key]) else {
                        panic!("PTTL")
                    };
                    let full = i64::try_from((SLICES + 1) * key.slice_ms).unwrap();
                    if kept.is_empty() {
                        assert_eq!(ttl, -2, "an empty budget key is not kept");
                    } else {
                        assert!(ttl <= full && ttl > full - 1_000, "PTTL {ttl} of {full}");
                    }
                }
            }
        }
        assert_eq!(lanes[0].noscripts, 0);
        tally.noscripts += lanes[1].noscripts;
    }
    eprintln!("redis_agreement (budgets): {tally:?}");
    assert_eq!(tally.noscripts, 1, "the script lane met NOSCRIPT once");
    assert!(tally.waits >= 200, "too few answers over a cap: {tally:?}");
    assert!(
        tally.on_boundaries >= 300 && tally.skewed >= 200,
        "{tally:?}"
    );
    assert!(tally.windows_emptied >= 10, "{tally:?}");
    assert!(
        tally.long_windows >= 500 && tally.long_waits >= 1,
        "too few answers of 30-day windows: {tally:?}"
    );
    assert!(
        tally.most_slices >= 50 && tally.many_slices >= 1000,
        "too few keys with many slices: {tally:?}"
    );
}

#[test]
fn a_budget_call_with_bad_arguments_changes_nothing() {
    let Some((_server, mut conn)) = loaded_server() else {
        return;
    };
    let key = "lg:x:{b1}:1";
    let fcall = |conn: &mut Conn, keys: &[&str], args: &[&str]| {
        let n = keys.len().to_string();
        let mut parts = vec!["FCALL", "loopguard_budget", &n];
        parts.extend_from_slice(keys);
        parts.extend_from_slice(args);
        conn.cmd(&parts)
    };
    assert_eq!(
        budget_answer(&fcall(&mut conn, &[key], &["120000", "1000", "5", "5"])),
        // Slice 120 leaves the window when slice 180 begins.
        [(5, 60_000)]
    );
    let bad = Resp::Error("loopguard: bad arguments".into());
    for args in [
        &["120000", "1000", "5"][..],                 // a number short
        &["120000", "1000", "5", "5", "1"],           // one too many
        &["120000", "0", "5", "5"],                   // no slice length
        &["120000", "44640001", "5", "5"],            // past a 31-day window
        &["120000", "1000", "-5", "5"],               // negative
        &["120000", "1000", "1.5", "5"],              // not whole
        &["120000", "1000", "9007199254740993", "5"], // past 2^53
        &["1e6", "1000", "5", "5"],                   // not digits
        &["", "1000", "5", "5"],                      // empty
    ] {
        assert_eq!(fcall(&mut conn, &[key], args), bad, "{args:?}");
    }
    // The second key's arguments are bad: the first is not added to either.
    assert_eq!(
        fcall(
            &mut conn,
            &[key, "lg:x:{b1}:2"],
            &["120000", "1000", "5", "0", "0", "5", "x"]
        ),
        bad
    );
    assert_eq!(budget_hash(&mut conn, key), [(120, 5)]);
    assert_eq!(conn.cmd(&["EXISTS", "lg:x:{b1}:2"]), Resp::Int(0));
    // A check of a key never spent on writes nothing.
    assert_eq!(
        budget_answer(&fcall(
            &mut conn,
            &["lg:x:{b1}:3"],
            &["120000", "1000", "0", "1"]
        )),
        [(0, 0)]
    );
    assert_eq!(conn.cmd(&["EXISTS", "lg:x:{b1}:3"]), Resp::Int(0));
    // No keys: an empty answer.
    assert_eq!(fcall(&mut conn, &[], &["120000"]), Resp::Array(vec![]));
}

/// A writer whose clock is ahead leaves a slice past the base clock's;
/// once the base clock has spent in 60 slices of its own, the key holds 61
/// and keeps the newest 60, as the core's slices do.
#[test]
fn a_key_keeps_its_newest_slices_as_the_core_does() {
    let Some((_server, mut conn)) = loaded_server() else {
        return;
    };
    let script = Script::shipped();
    let s = 1_000;
    for mut lane in [
        Lane::new(How::Function, "kfn"),
        Lane::new(How::Script, "ksc"),
    ] {
        let mut slices = Slices::default();
        let mut step = |lane: &mut Lane, at: u64, add: u64| {
            let key = BudgetKey {
                key: 9,
                slice_ms: s,
                add,
                cap: 100,
            };
            let call = redis::budget_call(lane.namespace, 1, &[key], at);
            let got = budget_answer(&lane.send(&mut conn, &script, &call));
            slices.add(at, add, at, s);
            let expected = (slices.total(at, s), slices.until_below(100, at, s));
            assert_eq!(got, [expected], "{:?} lane at {at}", lane.how);
            let mut kept = slices.spent.clone();
            kept.sort_unstable();
            assert_eq!(budget_hash(&mut conn, &call.keys[0]), kept);
            kept
        };
        // Ahead: slice 160 (its window starts at slice 101).
        step(&mut lane, 160 * s, 50);
        for i in 50..160 {
            let kept = step(&mut lane, i * s + 500, 1);
            assert_eq!(kept.len(), usize::try_from(i - 48).unwrap().min(60));
            assert_eq!(kept.last(), Some(&(160, 50)));
            if i >= 109 {
                // Slice i - 59 is still in the base clock's window, but 61
                // slices are more than a key keeps: the oldest goes.
                assert_eq!(kept.first(), Some(&(i - 58, 1)), "at slice {i}");
            }
        }
        // Far behind: a slice before the others, the oldest, dropped at once.
        let kept = step(&mut lane, 10 * s, 7);
        assert_eq!(kept.len(), 60);
        assert_eq!(kept.first(), Some(&(101, 1)), "slice 10 is not kept");
    }
}

/// Windows of 30 days and the longest, 31: their slices count exactly up
/// to the moment they leave, in Redis as in the core, and Redis keeps a
/// key 61 slices.
#[test]
fn month_long_windows_agree_to_the_millisecond() {
    let Some((_server, mut conn)) = loaded_server() else {
        return;
    };
    let script = Script::shipped();
    assert_eq!(slice_ms(THIRTY_DAYS_MS), 43_200_000);
    assert_eq!(slice_ms(LONGEST_WINDOW_MS), 44_640_000);
    for (window, mut lane) in [
        (THIRTY_DAYS_MS, Lane::new(How::Function, "lfn")),
        (THIRTY_DAYS_MS, Lane::new(How::Script, "lsc")),
        (LONGEST_WINDOW_MS, Lane::new(How::Function, "lfn")),
        (LONGEST_WINDOW_MS, Lane::new(How::Script, "lsc")),
    ] {
        let s = slice_ms(window);
        let mut slices = Slices::default();
        let start = 1_700_000_000_000 / s * s + 12_345;
        let mut step = |lane: &mut Lane, at: u64, add: u64| {
            let key = BudgetKey {
                key: window,
                slice_ms: s,
                add,
                cap: 100,
            };
            let call = redis::budget_call(lane.namespace, 1, &[key], at);
            let got = budget_answer(&lane.send(&mut conn, &script, &call));
            slices.add(at, add, at, s);
            let expected = (slices.total(at, s), slices.until_below(100, at, s));
            assert_eq!(got, [expected], "{:?} lane at {at}", lane.how);
            let Resp::Int(ttl) = conn.cmd(&["PTTL", &call.keys[0]]) else {
                panic!("PTTL")
            };
            if expected.0 > 0 {
                let full = i64::try_from(61 * s).unwrap();
                assert!(ttl <= full && ttl > full - 1_000, "PTTL {ttl} of {full}");
            }
            expected
        };
        // 60 at the start, 50 twenty days on: over the cap until the first
        // slice leaves, 60 slices after it began.
        assert_eq!(step(&mut lane, start, 60), (60, 0));
        let first_leaves = (start / s + 60) * s;
        assert_eq!(
            step(&mut lane, start + 20 * 86_400_000, 50),
            (110, first_leaves - start - 20 * 86_400_000)
        );
        assert_eq!(step(&mut lane, first_leaves - 1, 0), (110, 1));
        assert_eq!(step(&mut lane, first_leaves, 0), (50, 0));
        // And the second leaves a window after its slice began.
        let second_leaves = ((start + 20 * 86_400_000) / s + 60) * s;
        assert_eq!(step(&mut lane, second_leaves - 1, 0), (50, 0));
        assert_eq!(step(&mut lane, second_leaves, 0), (0, 0));
    }
}

/// A request's most caps: 8 keys of one caller (one group), each of its
/// own window and cap, all added and all checked in one call, in Redis as
/// in the core's budget table.
#[test]
fn eight_keys_of_one_group_are_all_added_and_checked() {
    let Some((_server, mut conn)) = loaded_server() else {
        return;
    };
    let script = Script::shipped();
    let windows = [
        60_000,
        3_600_000,
        86_400_000,
        7 * 86_400_000,
        THIRTY_DAYS_MS,
        LONGEST_WINDOW_MS,
        600_000,
        120_000,
    ];
    let caller = 0xfeed;
    let keys: Vec<BudgetKey> = windows
        .iter()
        .enumerate()
        .map(|(i, &w)| BudgetKey {
            key: 0x100 + i as u64,
            slice_ms: slice_ms(w),
            add: 0,
            cap: 50 + 10 * i as u64,
        })
        .collect();
    let table = BudgetTable::for_keys(64);
    for mut lane in [
        Lane::new(How::Function, "efn"),
        Lane::new(How::Script, "esc"),
    ] {
        let mut local = InProcess::default();
        let mut now = 1_700_000_000_000u64;
        // Answers of keys over their cap.
        let mut over = 0;
        for round in 0..12u64 {
            let adding: Vec<BudgetKey> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| BudgetKey {
                    add: 3 + i as u64 + round,
                    ..*k
                })
                .collect();
            let call = redis::budget_call(lane.namespace, caller, &adding, now);
            assert_eq!(call.keys.len(), 8);
            let added = budget_answer(&lane.send(&mut conn, &script, &call));
            let adds: Vec<Add> = adding
                .iter()
                .map(|k| Add {
                    key: k.key,
                    slice_ms: k.slice_ms,
                    amount: k.add,
                    cap: k.cap,
                })
                .collect();
            assert!(matches!(
                table.add(&mut local, caller, &adds, now, now),
                Added::Done { evicted: 0, .. }
            ));
            // A check only, a little later: every key's total and wait, the
            // same from Redis and from the table.
            now += 7_000;
            let call = redis::budget_call(lane.namespace, caller, &keys, now);
            let checked = budget_answer(&lane.send(&mut conn, &script, &call));
            let ids: Vec<u64> = keys.iter().map(|k| k.key).collect();
            let read = table.read(&mut local, caller, &ids).unwrap();
            let from_table: Vec<(u64, u64)> = keys
                .iter()
                .zip(&read)
                .map(|(k, s)| {
                    (
                        s.total(now, k.slice_ms),
                        s.until_below(k.cap, now, k.slice_ms),
                    )
                })
                .collect();
            assert_eq!(checked, from_table, "{:?} lane, round {round}", lane.how);
            assert_eq!(checked.len(), 8);
            for (i, ((total, _), (was, _))) in checked.iter().zip(&added).enumerate() {
                assert_eq!(total, was, "key {i} round {round}");
                assert!(*total > 0, "key {i} round {round}");
            }
            over += checked.iter().filter(|(_, wait)| *wait > 0).count();
            now += 3_000;
        }
        assert!(over >= 20, "{over} answers over a cap");
        // The 60 s window's spending has left it by now; the others hold
        // every add.
        let call = redis::budget_call(lane.namespace, caller, &keys, now);
        let checked = budget_answer(&lane.send(&mut conn, &script, &call));
        for (i, (total, _)) in checked.iter().enumerate().skip(1) {
            let all: u64 = (0..12).map(|r| 3 + i as u64 + r).sum();
            let kept = if windows[i] <= 120_000 { *total } else { all };
            assert_eq!(*total, kept, "key {i}");
        }
    }
}

/// A RESP reply as webdis writes it in JSON (`{"FCALL": ...}`), so the
/// core reads it as it would through Envoy.
fn webdis_json(reply: &Resp) -> Vec<u8> {
    fn value(r: &Resp) -> serde_json::Value {
        match r {
            Resp::Simple(s) => serde_json::json!([true, s]),
            Resp::Error(e) => serde_json::json!([false, e]),
            Resp::Int(n) => serde_json::json!(n),
            Resp::Bulk(s) => serde_json::json!(s),
            Resp::Array(items) => serde_json::Value::Array(items.iter().map(value).collect()),
        }
    }
    serde_json::json!({ "FCALL": value(reply) })
        .to_string()
        .into_bytes()
}

/// MCP call histories: what the library keeps is what the core's table
/// keeps (the newest 16 calls, flags and all; an unread call starting no
/// history; when the newest real result came), through the function and
/// the script alike.
#[test]
fn mcp_histories_in_redis_are_the_core_s() {
    use loopguard_core::detect::mcp::Entry;
    use loopguard_core::state::mcp_sessions;
    use loopguard_core::state::redis::mcp::{mcp_call, parse_added, parse_history};
    let Some((_server, mut conn)) = loaded_server() else {
        return;
    };
    let script = Script::shipped();
    let window = 3_600_000;
    for (how, ns) in [(How::Function, "mf"), (How::Script, "ms")] {
        let mut lane = Lane::new(how, ns);
        let mut local = InProcess::default();
        let mut rng = Rng(0x5eed_0000 + how as u64);
        let mut now = 1_000_000;
        for _ in 0..400 {
            now += 1 + rng.below(50);
            let key = 1 + rng.below(4);
            if rng.below(3) == 0 {
                let got = parse_history(
                    Some("200"),
                    &webdis_json(&lane.send(
                        &mut conn,
                        &script,
                        &mcp_call(ns, key, window, now, None),
                    )),
                )
                .unwrap();
                let want = mcp_sessions::read(
                    &mut local,
                    mcp_sessions::HistoryId::new(key, 0, 0),
                    now,
                    window,
                )
                .unwrap();
                assert_eq!(got.entries, want.entries, "{how:?} key {key}");
                assert_eq!(got.last_real_ms, want.last_real_ms, "{how:?} key {key}");
                continue;
            }
            let flags = rng.below(8);
            let entry = Entry {
                call: rng.below(3),
                result: rng.next(),
                content: rng.below(2),
                failed: flags & 1 != 0,
                unread: flags & 2 != 0 && rng.below(2) == 0,
                answered: flags & 4 != 0,
            };
            let reply = lane.send(
                &mut conn,
                &script,
                &mcp_call(ns, key, window, now, Some(&entry)),
            );
            assert_eq!(parse_added(Some("200"), &webdis_json(&reply)), Ok(()));
            mcp_sessions::append_after(
                &mut local,
                mcp_sessions::HistoryId::new(key, 0, 0),
                entry,
                now,
                window,
                None,
            )
            .unwrap();
        }
    }
    // A history expires its window after its last call; bad arguments
    // change nothing.
    let call = mcp_call(
        "mx",
        9,
        150,
        1,
        Some(&Entry {
            call: 1,
            ..Entry::default()
        }),
    );
    let mut lane = Lane::new(How::Function, "mx");
    assert_eq!(lane.send(&mut conn, &script, &call), Resp::Int(1));
    let [h, r] = redis::mcp::mcp_keys("mx", 9);
    let ttl = |conn: &mut Conn, k: &str| match conn.cmd(&["PTTL", k]) {
        Resp::Int(n) => n,
        other => panic!("{other:?}"),
    };
    assert!((1..=150).contains(&ttl(&mut conn, &h)) && (1..=150).contains(&ttl(&mut conn, &r)));
    let bad = Resp::Error("loopguard: bad arguments".into());
    for args in [
        &["0", "1"][..],
        &["86400001", "1"],
        &["100", "1", "1:2:3:0"],
        &["100", "1", "1:2:3", "0"],
        &["100", "1", "1:2:3:8", "8"],
        &["100", "1", "1:2:3:0 ", "0"],
    ] {
        let mut parts = vec!["FCALL", "loopguard_mcp", "2", &h, &r];
        parts.extend_from_slice(args);
        assert_eq!(conn.cmd(&parts), bad, "{args:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while conn.cmd(&["EXISTS", &h]) != Resp::Int(0) {
        assert!(Instant::now() < deadline, "the history did not expire");
        std::thread::sleep(Duration::from_millis(20));
    }
}
