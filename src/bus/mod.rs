//! The OVOS messagebus side: the envelope, a reconnecting client, the embedded
//! bus server, the socket options every bus socket gets, and where the bus is
//! (mycroft.conf).

pub mod client;
pub mod config;
pub mod envelope;
pub mod server;
pub mod tcp;

/// Largest websocket message toolboxd sends or accepts: room for a child's
/// largest line (`max_message_bytes`, 16 MiB by default) plus the envelope.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// The websocket settings shared by the client and the server.
pub fn ws_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}
