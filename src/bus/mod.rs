//! The OVOS messagebus side: the envelope, the daemon's client (a reconnecting
//! websocket, or in process on its own bus), the embedded bus server, the socket options every bus socket gets, and where the bus is
//! (mycroft.conf).

pub mod client;
pub mod config;
pub mod envelope;
pub mod server;
pub mod tcp;

/// Largest message the bus carries: the Python ovos-messagebus's default
/// (`websocket.max_msg_size`, 10 MiB). The embedded bus refuses larger ones,
/// and toolboxd never sends one (an answer that would be larger is replaced
/// by an error).
pub const MAX_FRAME_BYTES: usize = 10 * 1024 * 1024;

/// Largest message the daemon's own client accepts: more than the bus limit,
/// so a bus configured for larger messages never costs it its connection.
const MAX_RECEIVED_BYTES: usize = 64 * 1024 * 1024;

/// How much a websocket reads from its socket at a time. tungstenite zeroes
/// this much of its buffer before every read: its default (128 KiB) cost more
/// instructions per call than everything else on the call path together
/// (scripts/profile). Most bus messages are a few hundred bytes; a large one
/// (a tool list) takes more reads, so not smaller than this.
const READ_BUFFER_BYTES: usize = 32 * 1024;

/// The websocket settings of the daemon's bus client.
pub fn client_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(MAX_RECEIVED_BYTES))
        .max_frame_size(Some(MAX_RECEIVED_BYTES))
}

/// The websocket settings of the embedded bus, for each of its clients.
pub fn server_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}
