//! Acting: the verdict from a policy and a window state, the 429 and the
//! headers a client and the upstream see, throttled requests waiting for
//! their time, held request headers, events and alerts.

pub mod budget;
pub mod decision;
pub mod delay_queue;
pub mod events;
pub mod hold;
pub mod mcp_reply;
pub mod reply;
pub mod shadow;
