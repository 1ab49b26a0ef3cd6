//! Where each of the host's events enters the flow, a file per phase of a
//! request: its headers (which policy applies, whether it is judged now or
//! after its body), its body (read once, handed to each guard the policy
//! has), the response (what the client sees, a failed attempt's hit taken
//! back, calls sent from the root reported) and the tick and endings.

mod body;
mod headers;
mod response;
mod tick;
