//! The stub's socket as frames (docs/python-backend.md, "The stub
//! protocol"): length-prefixed JSON, and, beside a `segment` frame, the
//! file descriptor of a new shared-memory segment (SCM_RIGHTS).
//!
//! Segments are anonymous memory files (`memfd_create`) whose descriptors
//! cross the socket, never files in /dev/shm: nothing is left behind
//! whatever kills either process, and the pools are not bounded by the
//! 64 MiB /dev/shm that containers get by default.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use serde::de::DeserializeOwned;

use crate::protocol::{FromStub, MAX_FRAME_BYTES, ToStub};

/// Bytes read from the socket at a time, at least.
const READ_CHUNK: usize = 64 << 10;

/// The most descriptors one read takes (a frame carries at most one, and
/// the kernel hands over one sender's message's at a time).
const MAX_FDS_PER_READ: usize = 4;

/// A frame's bytes: its length (4 bytes, little-endian) and its JSON.
fn frame(message: &ToStub) -> io::Result<Vec<u8>> {
    let mut frame = vec![0u8; 4];
    serde_json::to_writer(&mut frame, message).map_err(io::Error::other)?;
    let len = u32::try_from(frame.len() - 4).map_err(|_| io::Error::other("frame too large"))?;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    Ok(frame)
}

/// Writes one frame.
pub fn write_frame(out: &mut impl Write, message: &ToStub) -> io::Result<()> {
    out.write_all(&frame(message)?)
}

/// Writes one frame with `fd` beside it: the descriptor reaches the stub
/// with the frame's first byte.
pub fn write_frame_with_fd(socket: &mut UnixStream, message: &ToStub, fd: BorrowedFd<'_>) -> io::Result<()> {
    let frame = frame(message)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for a descriptor in the control buffer"));
    }
    let sent = loop {
        match rustix::net::sendmsg(&*socket, &[IoSlice::new(&frame)], &mut control, SendFlags::NOSIGNAL) {
            Ok(sent) => break sent,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    socket.write_all(&frame[sent..])
}

/// The reading end: whole frames out of a buffer, and the descriptors
/// that came with them, in order.
#[derive(Debug)]
pub struct FrameReader {
    socket: UnixStream,
    buf: Vec<u8>,
    /// The unread bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    fds: VecDeque<OwnedFd>,
    /// What the socket's read timeout was last set to.
    read_timeout: Option<Duration>,
}

impl FrameReader {
    pub fn new(socket: UnixStream) -> Self {
        FrameReader {
            socket,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            fds: VecDeque::new(),
            read_timeout: None,
        }
    }

    /// Bounds each wait of the reads to come by `timeout`, rounded up to
    /// a whole millisecond (at least one: zero means "none" to the socket).
    /// The socket is told only when that changes, not on every read.
    pub fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        let millis = u64::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let timeout = Duration::from_millis(millis.max(1));
        if self.read_timeout != Some(timeout) {
            self.socket.set_read_timeout(Some(timeout))?;
            self.read_timeout = Some(timeout);
        }
        Ok(())
    }

    /// The oldest descriptor received and not yet taken: a `segment`
    /// frame's, taken when that frame is read.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    /// Reads one frame; `Ok(None)` at end of file between frames. The
    /// socket's read timeout bounds each wait (`WouldBlock`/`TimedOut`).
    pub fn read_frame(&mut self) -> io::Result<Option<FromStub>> {
        self.read_frame_as()
    }

    /// [`Self::read_frame`], as any message type.
    pub fn read_frame_as<T: DeserializeOwned>(&mut self) -> io::Result<Option<T>> {
        loop {
            let unread = &self.buf[self.start..self.end];
            if unread.len() >= 4 {
                let len = u32::from_le_bytes(unread[..4].try_into().expect("four bytes")) as usize;
                if len > MAX_FRAME_BYTES {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a frame of {len} bytes, over the {MAX_FRAME_BYTES}-byte limit"),
                    ));
                }
                if unread.len() >= 4 + len {
                    let body = &unread[4..4 + len];
                    self.start += 4 + len;
                    let message = serde_json::from_slice(body)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("a malformed message: {e}")))?;
                    return Ok(Some(message));
                }
                self.make_room(4 + len);
            } else {
                self.make_room(4);
            }
            if self.fill()? == 0 {
                return match self.start == self.end {
                    true => Ok(None),
                    false => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the socket closed in the middle of a frame",
                    )),
                };
            }
        }
    }

    /// Moves the unread bytes to the front and makes the buffer hold at
    /// least `frame` bytes (a frame is at most [`MAX_FRAME_BYTES`]).
    fn make_room(&mut self, frame: usize) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let wanted = frame.max(self.end + READ_CHUNK);
        if self.buf.len() < wanted {
            self.buf.resize(wanted, 0);
        }
    }

    /// One read into the buffer's free end; the bytes read (0: end of file).
    fn fill(&mut self) -> io::Result<usize> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = loop {
            let mut iov = [IoSliceMut::new(&mut self.buf[self.end..])];
            match rustix::net::recvmsg(&self.socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
                Ok(received) => break received,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                self.fds.extend(fds);
            }
        }
        if received.flags.contains(ReturnFlags::CTRUNC) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more descriptors came with one message than the protocol allows",
            ));
        }
        self.end += received.bytes;
        Ok(received.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    /// Frames as the stub writes them.
    fn stub_frame(json: &str) -> Vec<u8> {
        let mut frame = (json.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(json.as_bytes());
        frame
    }

    #[test]
    fn frames_and_descriptors_arrive_in_order_and_bad_frames_are_refused() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut reader = FrameReader::new(ours.try_clone().unwrap());

        // A frame with a descriptor, then two in one write.
        let file = tempfile::tempfile().unwrap();
        file.set_len(123).unwrap();
        let segment = stub_frame(r#"{"op":"segment","seg":0}"#);
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [file.as_fd()];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(&theirs, &[IoSlice::new(&segment)], &mut control, SendFlags::empty()).unwrap();
        let mut two = stub_frame(r#"{"op":"response","request":1,"response":null,"flags":1}"#);
        two.extend(stub_frame(r#"{"op":"ready"}"#));
        theirs.write_all(&two).unwrap();

        assert!(matches!(
            reader.read_frame().unwrap(),
            Some(FromStub::Segment { seg: 0 })
        ));
        let fd = reader.take_fd().expect("the segment's descriptor");
        assert_eq!(std::fs::File::from(fd).metadata().unwrap().len(), 123);
        assert!(reader.take_fd().is_none());
        assert!(matches!(
            reader.read_frame().unwrap(),
            Some(FromStub::Response { request: 1, .. })
        ));
        assert!(matches!(reader.read_frame().unwrap(), Some(FromStub::Ready)));

        // A frame larger than one read.
        let message = format!(r#"{{"op":"failed","message":"{}"}}"#, "x".repeat(200_000));
        let big = stub_frame(&message);
        let writer = std::thread::spawn(move || {
            theirs.write_all(&big).unwrap();
            theirs
        });
        match reader.read_frame().unwrap() {
            Some(FromStub::Failed { message }) => assert_eq!(message.len(), 200_000),
            other => panic!("{other:?}"),
        }
        let mut theirs = writer.join().unwrap();

        // Garbage, then an oversized length.
        theirs.write_all(&stub_frame("{x}")).unwrap();
        assert!(reader.read_frame().unwrap_err().to_string().contains("malformed"));
        theirs.write_all(&((MAX_FRAME_BYTES + 1) as u32).to_le_bytes()).unwrap();
        assert_eq!(reader.read_frame().unwrap_err().kind(), io::ErrorKind::InvalidData);

        // End of file between frames, and in the middle of one.
        let (ours, theirs) = UnixStream::pair().unwrap();
        drop(theirs);
        assert!(FrameReader::new(ours).read_frame().unwrap().is_none());
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(&[10, 0, 0, 0, b'{']).unwrap();
        drop(theirs);
        assert_eq!(
            FrameReader::new(ours).read_frame().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn a_frame_written_with_a_descriptor_carries_it() {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        file.set_len(77).unwrap();
        write_frame_with_fd(&mut ours, &ToStub::Segment { seg: 2 }, file.as_fd()).unwrap();
        let mut frame = [0u8; 64];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &theirs,
            &mut [IoSliceMut::new(&mut frame)],
            &mut control,
            RecvFlags::empty(),
        )
        .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&frame[4..got.bytes]).unwrap();
        assert_eq!(body, serde_json::json!({"op": "segment", "seg": 2}));
        let mut received = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                received.extend(fds);
            }
        }
        assert_eq!(received.len(), 1);
        let fd = received.pop().unwrap();
        assert_eq!(std::fs::File::from(fd).metadata().unwrap().len(), 77);
        drop(ours);
        let mut rest = Vec::new();
        (&theirs).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
}
