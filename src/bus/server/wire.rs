//! A client's socket, split: tungstenite reads it (frames, masks, limits,
//! pings), the bus writes it ([`write`]).
//!
//! Why not tungstenite for writing too: it copies every frame it sends into
//! a buffer of its own per connection, which keeps its largest size for as
//! long as the connection lives. A 10 MiB message relayed to 250 clients
//! was 250 copies, and 2.5 GB kept after it (more still while those clients
//! did not read). The bus writes a frame's header and then the payload
//! every client shares: a client that does not read holds a reference to
//! the frame, not a copy. Frames from server to client are not masked
//! (RFC 6455 §5.1), so the payload is the same bytes for every client.
//!
//! What tungstenite still writes after the handshake (the pong to a ping,
//! the reply to a close) reaches the writer through a small channel
//! ([`Wire::detach`]).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::queue::{at_ms, now_ms, Inbox};
use super::{PARTIAL_BYTES, PARTIAL_SHARE_BYTES};

/// Control frames (pongs, a close reply) waiting for the writer; past this
/// many, a pong is dropped (a client that floods pings and does not read
/// gets no answer to some: RFC 6455 lets pongs be skipped for later ones).
const CONTROL_QUEUE: usize = 16;

/// Frames up to this size are copied into one buffer and written with the
/// others of their burst (one system call); larger ones are written from
/// the shared payload.
const COPY_MAX: usize = 16 * 1024;

/// A burst copies frames into the write buffer up to this size (more stays
/// queued, shared and counted against the client); the buffer is dropped if
/// it grew larger, so that one large burst does not stay with the connection.
const KEEP_MAX: usize = 64 * 1024;

/// A close frame, code 1000 (normal closure): the bus's goodbye.
const GOODBYE: [u8; 4] = [0x88, 0x02, 0x03, 0xE8];

/// What the writer takes over once the handshake is done.
pub(super) struct Detached {
    /// The socket's writing half.
    pub(super) out: OwnedWriteHalf,
    /// The control frames tungstenite writes (pongs, a close reply).
    pub(super) control: mpsc::Receiver<Vec<u8>>,
    /// Where the bus's own pings go, among those control frames.
    pub(super) pinger: mpsc::Sender<Vec<u8>>,
}

/// The stream tungstenite reads from, counting what the client sends of
/// messages not yet complete against the budget shared by every client
/// ([`PARTIAL_BYTES`], of which each may always use
/// [`PARTIAL_SHARE_BYTES`]), and when it started the message now unfinished. During the handshake its writes go to the socket;
/// once [`Wire::detach`]ed, to the writer.
pub(super) struct Wire {
    /// The socket's reading half.
    read: OwnedReadHalf,
    /// The socket's writing half, until the handshake is done.
    write: Option<OwnedWriteHalf>,
    /// After the handshake: where tungstenite's control frames go.
    control: Option<mpsc::Sender<Vec<u8>>>,
    /// Bytes this client sent since its last complete message.
    pub(super) unfinished: Arc<AtomicUsize>,
    /// When the first of those bytes came, in milliseconds since the bus's
    /// epoch: the unfinished message's deadline runs from there.
    pub(super) since: Arc<AtomicU64>,
    /// The sum of `unfinished` over every client.
    pub(super) partial: Arc<AtomicUsize>,
}

impl Wire {
    pub(super) fn new(stream: TcpStream, partial: Arc<AtomicUsize>) -> Wire {
        let (read, write) = stream.into_split();
        Wire {
            read,
            write: Some(write),
            control: None,
            unfinished: Arc::new(AtomicUsize::new(0)),
            since: Arc::new(AtomicU64::new(0)),
            partial,
        }
    }

    /// When the unfinished message whose start is `since` began.
    pub(super) fn started(since: &AtomicU64) -> tokio::time::Instant {
        at_ms(since.load(Ordering::Relaxed))
    }

    /// The handshake is done: gives the writing half to the writer, and
    /// sends what tungstenite writes from now on (control frames) down a
    /// channel the writer reads; the bus's own pings go down it too (the
    /// sender returned).
    pub(super) fn detach(&mut self) -> Option<Detached> {
        let (tx, rx) = mpsc::channel(CONTROL_QUEUE);
        self.control = Some(tx.clone());
        Some(Detached {
            out: self.write.take()?,
            control: rx,
            pinger: tx,
        })
    }

    /// A control frame of `n` bytes was read whole: those bytes are no
    /// longer counted (what else is unfinished still is).
    pub(super) fn release(unfinished: &AtomicUsize, partial: &AtomicUsize, n: usize) {
        let mut taken = 0;
        let _ = unfinished.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            taken = held.min(n);
            Some(held - taken)
        });
        partial.fetch_sub(taken, Ordering::Relaxed);
    }

    /// A message ended: what it took is no longer counted.
    pub(super) fn settle(unfinished: &AtomicUsize, partial: &AtomicUsize) {
        partial.fetch_sub(unfinished.swap(0, Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        Wire::settle(&self.unfinished, &self.partial);
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.read).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            let own = self.unfinished.fetch_add(n, Ordering::Relaxed) + n;
            if own == n {
                self.since.store(now_ms(), Ordering::Relaxed);
            }
            let total = self.partial.fetch_add(n, Ordering::Relaxed) + n;
            if total > PARTIAL_BYTES && own > PARTIAL_SHARE_BYTES {
                tracing::warn!(
                    "a bus client's unfinished message ({own} bytes) would make the unfinished \
                     messages of every client pass {PARTIAL_BYTES} bytes; disconnecting it"
                );
                return Poll::Ready(Err(io::Error::other(format!(
                    "unfinished messages of every client pass {PARTIAL_BYTES} bytes"
                ))));
            }
        }
        polled
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(write) = &mut self.write {
            return Pin::new(write).poll_write(cx, buf);
        }
        match &self.control {
            // Whole frames: tungstenite writes its pending control frames
            // in one call, and this takes all of it.
            Some(control) => match control.try_send(buf.to_vec()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => Poll::Ready(Ok(buf.len())),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()))
                }
            },
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.write {
            Some(write) => Pin::new(write).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.write {
            Some(write) => Pin::new(write).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// The writing side of a connection after its handshake.
pub(super) struct Writer {
    /// The socket's writing half.
    out: OwnedWriteHalf,
    /// Control frames tungstenite wrote (`None` once that channel closed).
    control: Option<mpsc::Receiver<Vec<u8>>>,
    /// Small frames of a burst, copied, to be written at once.
    buf: Vec<u8>,
    /// A write was cut short (the writer dropped in the middle of a frame):
    /// nothing more may be written on this connection.
    torn: bool,
    /// A close frame went out: the connection says nothing more.
    closed: bool,
}

impl Writer {
    pub(super) fn new(out: OwnedWriteHalf, control: mpsc::Receiver<Vec<u8>>) -> Writer {
        Writer {
            out,
            control: Some(control),
            buf: Vec::new(),
            torn: false,
            closed: false,
        }
    }

    /// Writes what `inbox` brings, and tungstenite's control frames, until
    /// the queue is taken away (the client removed, or the connection ending
    /// and everything queued written) or the socket fails. The small frames
    /// queued when a burst starts are written with one system call (up to
    /// [`KEEP_MAX`] bytes of them).
    pub(super) async fn run(&mut self, inbox: &mut Inbox) -> io::Result<()> {
        loop {
            tokio::select! {
                chunk = recv(&mut self.control), if self.control.is_some() => match chunk {
                    Some(chunk) => self.control_frame(&chunk).await?,
                    None => self.control = None,
                },
                frame = inbox.recv() => {
                    let Some(relayed) = frame else { return Ok(()) };
                    self.frame(relayed.frame.as_bytes()).await?;
                    // What is left of the burst past KEEP_MAX stays queued,
                    // shared and counted, not copied here.
                    while self.buf.len() < KEEP_MAX {
                        let Some(more) = inbox.try_recv() else { break };
                        self.frame(more.frame.as_bytes()).await?;
                    }
                    self.flush().await?;
                }
            }
        }
    }

    /// Ends the connection politely, if it can be done at once: the control
    /// frames waiting, then the bus's close frame (unless one went out).
    pub(super) async fn goodbye(&mut self) {
        if self.torn {
            return;
        }
        while let Some(chunk) = self.control.as_mut().and_then(|c| c.try_recv().ok()) {
            if self.control_frame(&chunk).await.is_err() {
                return;
            }
        }
        if !self.closed {
            let _ = self.write(&GOODBYE).await;
        }
    }

    /// Queues one text frame (small ones into the burst's buffer), or
    /// writes it from the shared payload.
    async fn frame(&mut self, payload: &[u8]) -> io::Result<()> {
        header(&mut self.buf, payload.len());
        if payload.len() <= COPY_MAX {
            self.buf.extend_from_slice(payload);
            return Ok(());
        }
        self.flush().await?;
        self.write(payload).await
    }

    async fn control_frame(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.flush().await?;
        self.closed |= has_close(chunk);
        self.write(chunk).await
    }

    /// Writes the burst's buffer, and drops it if it grew large.
    async fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let buf = std::mem::take(&mut self.buf);
            let written = self.write(&buf).await;
            self.buf = buf;
            self.buf.clear();
            written?;
        }
        if self.buf.capacity() > KEEP_MAX {
            self.buf = Vec::new();
        }
        Ok(())
    }

    /// Writes all of `bytes`; if this future is dropped part way, the
    /// connection is torn and takes no more frames.
    async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.torn = true;
        self.out.write_all(bytes).await?;
        self.torn = false;
        Ok(())
    }
}

/// The next control frame, when there is a channel.
async fn recv(control: &mut Option<mpsc::Receiver<Vec<u8>>>) -> Option<Vec<u8>> {
    match control {
        Some(control) => control.recv().await,
        None => std::future::pending().await,
    }
}

/// Whether control frames written by tungstenite (unmasked, payloads of at
/// most 125 bytes) include a close frame.
fn has_close(mut frames: &[u8]) -> bool {
    while frames.len() >= 2 {
        if frames[0] == 0x88 {
            return true;
        }
        let len = usize::from(frames[1] & 0x7F);
        frames = frames.get(2 + len..).unwrap_or_default();
    }
    false
}

/// Appends the header of an unmasked, final text frame of `len` bytes
/// (RFC 6455 §5.2).
fn header(buf: &mut Vec<u8>, len: usize) {
    buf.push(0x81);
    match len {
        0..=125 => buf.push(len as u8),
        126..=0xFFFF => {
            buf.push(126);
            buf.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            buf.push(127);
            buf.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{has_close, header};

    #[test]
    fn a_close_is_found_among_control_frames() {
        let pong = [0x8A, 2, 0x88, 1];
        assert!(!has_close(&pong), "a pong whose payload looks like a close");
        assert!(has_close(&[0x8A, 2, 0x88, 1, 0x88, 2, 0x03, 0xE8]));
        assert!(has_close(&[0x88, 0]));
    }

    #[test]
    fn headers_use_the_shortest_length_form() {
        let head = |len| {
            let mut buf = Vec::new();
            header(&mut buf, len);
            buf
        };
        assert_eq!(head(0), [0x81, 0]);
        assert_eq!(head(125), [0x81, 125]);
        assert_eq!(head(126), [0x81, 126, 0, 126]);
        assert_eq!(head(65_535), [0x81, 126, 0xFF, 0xFF]);
        assert_eq!(head(65_536), [0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
    }
}
