//! The request's facts the core asks for (`RequestFacts`): headers from
//! the block read once, the rest from Envoy on demand.

use crate::abi::{self, Attribute, FilterPtr, Metadata};
use loopguard_core::host::{HeaderBlock, RequestFacts};

pub struct Facts<'a> {
    pub filter: FilterPtr,
    pub headers: &'a HeaderBlock,
}

impl RequestFacts for Facts<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers.get(name).map(<[u8]>::to_vec)
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers.get(name).is_some()
    }

    fn source_address(&self) -> Option<String> {
        text(abi::attribute(self.filter, Attribute::SourceAddress))
    }

    /// Envoy's dynamic-module ABI reads one top-level metadata key, and
    /// `jwt_authn` keeps claims nested under the payload key: not readable
    /// here (`loopguard check` says so; `claim_to_headers` and a header
    /// limit key give the same verified value).
    fn verified_claim(&self, _payload_key: &str, _claim: &str) -> Option<Vec<u8>> {
        None
    }

    fn route_name(&self) -> Option<String> {
        text(abi::attribute(self.filter, Attribute::XdsRouteName))
    }

    fn route_policy(&self) -> Option<String> {
        text(abi::metadata_string(
            self.filter,
            Metadata::Route,
            "loopguard",
            "policy",
        ))
    }
}

fn text(raw: Option<Vec<u8>>) -> Option<String> {
    String::from_utf8(raw?).ok().filter(|s| !s.is_empty())
}
