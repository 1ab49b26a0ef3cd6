use super::*;

#[test]
fn tunnels_are_judged_on_their_headers() {
    assert!(is_tunnel("CONNECT", None));
    assert!(is_tunnel("connect", None));
    assert!(is_tunnel("GET", Some(b"websocket")));
    assert!(!is_tunnel("GET", Some(b" ")));
    assert!(!is_tunnel("POST", None));
}
use std::collections::HashMap;

/// Request facts from a table, for tests.
#[derive(Default, Clone)]
pub struct FakeFacts {
    pub headers: HashMap<String, Vec<u8>>,
    pub source: Option<String>,
    /// (payload key, claim) -> value
    pub verified: HashMap<(String, String), Vec<u8>>,
    pub route_name: Option<String>,
    pub route_policy: Option<String>,
}

impl FakeFacts {
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.headers
            .insert(name.to_string(), value.as_bytes().to_vec());
        self
    }
}

impl RequestFacts for FakeFacts {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers.get(name).cloned()
    }
    fn source_address(&self) -> Option<String> {
        self.source.clone()
    }
    fn verified_claim(&self, payload_key: &str, claim: &str) -> Option<Vec<u8>> {
        self.verified
            .get(&(payload_key.to_string(), claim.to_string()))
            .cloned()
    }
    fn route_name(&self) -> Option<String> {
        self.route_name.clone()
    }
    fn route_policy(&self) -> Option<String> {
        self.route_policy.clone()
    }
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn serialized(pairs: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

#[test]
fn header_block_parses_the_host_encoding() {
    let h = HeaderBlock::parse(serialized(&[
        (":method", b"POST"),
        (":path", b"/v1/x?a=1"),
        ("x-bin", b"\xff\x00z"),
        ("empty", b""),
    ]))
    .unwrap();
    assert_eq!(h.get(":method"), Some(&b"POST"[..]));
    assert_eq!(h.get("x-bin"), Some(&b"\xff\x00z"[..]));
    assert_eq!(h.get("empty"), Some(&b""[..]));
    assert_eq!(h.get("missing"), None);
    assert_eq!(h.text(":path"), "/v1/x?a=1");
    assert_eq!(h.text("x-bin"), "\u{fffd}\u{0}z");
    assert!(HeaderBlock::parse(Vec::new()).unwrap().get("a").is_none());
    // Truncated or lying buffers are refused, never read past.
    let good = serialized(&[("a", b"b")]);
    assert!(HeaderBlock::parse(good[..good.len() - 1].to_vec()).is_none());
    assert!(HeaderBlock::parse(vec![255, 255, 255, 255]).is_none());
    assert!(HeaderBlock::parse(vec![1, 0]).is_none());
}

#[test]
fn header_block_from_pairs_reads_as_the_host_encoding() {
    let pairs: [(&str, &[u8]); 4] = [
        (":method", b"POST"),
        ("x-bin", b"\xff\x00z"),
        ("empty", b""),
        ("x-bin", b"second"),
    ];
    let parsed = HeaderBlock::parse(serialized(&pairs)).unwrap();
    let given = HeaderBlock::from_pairs(pairs.iter().map(|(k, v)| (k.as_bytes(), *v)));
    for name in [":method", "x-bin", "empty", "missing"] {
        assert_eq!(given.get(name), parsed.get(name), "{name}");
    }
    assert_eq!(
        given.get("x-bin"),
        Some(&b"\xff\x00z"[..]),
        "the first value"
    );
    let line = given.request_line();
    let head = line.head();
    assert_eq!((head.method, head.path, head.authority), ("POST", "", ""));
}

#[test]
fn splits_path_query_fragment() {
    let h = RequestHead {
        method: "GET",
        path: "/a/b?x=1&y=2#frag",
        authority: "h",
    };
    assert_eq!(h.path_only(), "/a/b");
    assert_eq!(h.query(), "x=1&y=2");
    let h = RequestHead {
        method: "GET",
        path: "/a",
        authority: "h",
    };
    assert_eq!((h.path_only(), h.query()), ("/a", ""));
}

#[test]
fn query_pairs_sorted_and_decoded() {
    assert_eq!(sorted_query_pairs("a=2&a=1"), sorted_query_pairs("a=1&a=2"));
    assert_ne!(sorted_query_pairs("a=1"), sorted_query_pairs("a=1&a=2"));
    assert_eq!(
        sorted_query_pairs("b=%41+c&a&&a="),
        vec![(b("a"), b("")), (b("a"), b("")), (b("b"), b("A c"))]
    );
    assert_eq!(sorted_query_pairs("x=%zz%4"), vec![(b("x"), b("%zz%4"))]);
    assert!(sorted_query_pairs("").is_empty());
}

#[test]
fn query_values_for_one_key() {
    assert_eq!(
        query_values("user=b&x=1&user=a", "user"),
        vec![b("a"), b("b")]
    );
    assert_eq!(query_values("user=", "user"), vec![b("")]);
    assert!(query_values("x=1", "user").is_empty());
}

#[test]
fn bearer_and_api_keys() {
    assert_eq!(bearer_token(b"Bearer sk-1"), Some(&b"sk-1"[..]));
    assert_eq!(bearer_token(b"  bearer   sk-2 "), Some(&b"sk-2"[..]));
    assert_eq!(bearer_token(b"Basic abc"), None);
    assert_eq!(bearer_token(b"Bearer "), None);
    let f = FakeFacts::default()
        .with("authorization", "Bearer sk-1")
        .with("x-api-key", "k");
    assert_eq!(api_key(&f), Some(b("sk-1")));
    let f = FakeFacts::default().with("x-api-key", " k2 ");
    assert_eq!(api_key(&f), Some(b("k2")));
    let f = FakeFacts::default().with("authorization", "Basic dTpw");
    assert_eq!(api_key(&f), Some(b("Basic dTpw")));
    let f = FakeFacts::default().with("api-key", "azure");
    assert_eq!(api_key(&f), Some(b("azure")));
    assert_eq!(api_key(&FakeFacts::default()), None);
}

#[test]
fn jwt_claims_without_verification() {
    // {"alg":"none"} . {"sub":"user-1","org":{"id":7},"n":3}
    let header = "eyJhbGciOiJub25lIn0";
    let payload = "eyJzdWIiOiJ1c2VyLTEiLCJvcmciOnsiaWQiOjd9LCJuIjozfQ";
    let auth = format!("Bearer {header}.{payload}.sig");
    assert_eq!(jwt_claim(auth.as_bytes(), "sub"), Some(b("user-1")));
    assert_eq!(jwt_claim(auth.as_bytes(), "org"), Some(b("{\"id\":7}")));
    assert_eq!(jwt_claim(auth.as_bytes(), "n"), Some(b("3")));
    assert_eq!(jwt_claim(auth.as_bytes(), "missing"), None);
    assert_eq!(jwt_claim(b"Bearer not-a-jwt", "sub"), None);
    assert_eq!(jwt_claim(b"Bearer a.!!!.c", "sub"), None);
    assert_eq!(
        jwt_claim(format!("Bearer {header}.{payload}").as_bytes(), "sub"),
        None
    );
}

#[test]
fn base64url() {
    assert_eq!(base64url_decode(b"aGVsbG8"), Some(b("hello")));
    assert_eq!(base64url_decode(b"aGVsbG8="), Some(b("hello")));
    assert_eq!(base64url_decode(b"_-8"), Some(vec![0xff, 0xef]));
    assert_eq!(base64url_decode(b"a"), None);
    assert_eq!(base64url_decode(b"a*b"), None);
    assert_eq!(base64url_decode(b""), Some(vec![]));
}

#[test]
fn limit_key_values_per_source() {
    let head = RequestHead {
        method: "GET",
        path: "/?u=b&u=a",
        authority: "h",
    };
    let mut f = FakeFacts::default()
        .with("x-org", "o1")
        .with("authorization", "Bearer e30.eyJzdWIiOiJ1MSJ9.s");
    f.source = Some("[::1]:80".into());
    f.verified
        .insert(("jwt_payload".into(), "sub".into()), b("alice"));
    let v = |k: LimitKey| limit_key_values(&k, &head, &f, "jwt_payload");
    assert_eq!(v(LimitKey::Header("x-org".into())), vec![b("o1")]);
    assert!(v(LimitKey::Header("x-missing".into())).is_empty());
    assert_eq!(v(LimitKey::Query("u".into())), vec![b("a"), b("b")]);
    assert_eq!(v(LimitKey::Jwt("sub".into())), vec![b("u1")]);
    assert_eq!(v(LimitKey::JwtVerified("sub".into())), vec![b("alice")]);
    assert!(limit_key_values(&LimitKey::JwtVerified("sub".into()), &head, &f, "other").is_empty());
    assert_eq!(v(LimitKey::IpAddress), vec![b("::1")]);
}

#[test]
fn addresses() {
    assert_eq!(address_without_port("10.0.0.1:5555"), "10.0.0.1");
    assert_eq!(address_without_port("[::1]:5555"), "::1");
    assert_eq!(address_without_port("10.0.0.1"), "10.0.0.1");
    assert_eq!(address_without_port("::1"), "::1");
    assert_eq!(address_without_port("envoy://internal"), "envoy://internal");
}
