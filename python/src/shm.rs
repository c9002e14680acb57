//! The shared memory tensors cross in (docs/python-backend.md, "Shared
//! memory"): two pools per stub, each side allocating its own and freeing
//! the other's blocks with one store into their headers. A pool's
//! segments are anonymous memory files whose descriptors go to the other
//! side over the socket as they are made ([`crate::channel`]).
//!
//! The server's pool (the host pool) is a ring per segment: blocks are
//! taken at the head and reclaimed at the tail once the stub has freed
//! them, in order. Inputs are freed in roughly the order they were sent;
//! one the model keeps holds its ring, and the pool grows another segment,
//! up to its limit. The stub's blocks reach the server as [`Bytes`] that
//! point into the mapping: an output is never copied on this side, and its
//! block is freed when the last of those bytes is dropped.
//!
//! Unsafe code: a mapping another process writes is memory Rust cannot
//! check; every access goes through [`Segment`], bounds-checked by its
//! callers, with block headers touched only atomically.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::Bytes;
use memmap2::MmapRaw;
use nereid_core::error::{Error, Result};

use crate::protocol::{Descriptor, ToStub};
use crate::stub::Writer;

/// A block's header, before its data.
pub const HEADER: usize = 16;
/// Blocks start at multiples of this.
pub const ALIGN: usize = 64;

const LIVE: u32 = 1;
const FREED: u32 = 2;
const WRAP: u32 = 3;

/// The most segments a stub may make: a bound on the mappings the server
/// holds for it.
const MAX_STUB_SEGMENTS: usize = 1024;

/// One mapped segment file.
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
}

impl Segment {
    /// Creates a segment of `size` bytes named `name` (a label: the file
    /// has no path), and its file, whose descriptor the other side maps.
    fn create(name: &str, size: usize) -> io::Result<(Segment, File)> {
        let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
        let file = File::from(fd);
        file.set_len(size as u64)?;
        // Reserve the memory now: a memory file sized by ftruncate alone is
        // sparse, and touching a page the system has no room for would kill
        // the process with SIGBUS instead of failing here, clearly.
        let len = libc::off_t::try_from(size).map_err(|_| io::Error::other("segment size out of range"))?;
        // SAFETY: a plain call on a file descriptor this function owns.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
            0 => {}
            code => return Err(io::Error::from_raw_os_error(code)),
        }
        Ok((Self::map(&file)?, file))
    }

    /// Maps a segment the other side made, whole, from its descriptor.
    fn from_fd(fd: OwnedFd) -> io::Result<Segment> {
        Self::map(&File::from(fd))
    }

    fn map(file: &File) -> io::Result<Segment> {
        Ok(Segment {
            map: MmapRaw::map_raw(file)?,
        })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The state word of the block at `block` (64-byte aligned, in bounds).
    fn state(&self, block: usize) -> &AtomicU32 {
        debug_assert!(block.is_multiple_of(ALIGN) && block + HEADER <= self.len());
        // SAFETY: in bounds and aligned (the mapping is page aligned); the
        // other process touches this word only atomically, as a u32 store.
        unsafe { &*self.map.as_mut_ptr().add(block).cast::<AtomicU32>() }
    }

    /// The data length in the block's header.
    fn data_len(&self, block: usize) -> u64 {
        // SAFETY: as for `state`; 8 + 8 <= HEADER.
        unsafe { &*self.map.as_mut_ptr().add(block + 8).cast::<AtomicU64>() }.load(Ordering::Acquire)
    }

    fn set_header(&self, block: usize, state: u32, len: u64) {
        // SAFETY: as for `data_len`.
        unsafe { &*self.map.as_mut_ptr().add(block + 8).cast::<AtomicU64>() }.store(len, Ordering::Relaxed);
        self.state(block).store(state, Ordering::Release);
    }

    /// `len` bytes at `off`, checked in bounds by the caller.
    ///
    /// SAFETY: the caller owns those bytes (a live block of its own pool
    /// being written, or one of the other side's that it has not freed).
    unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off), len) }
    }

    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(off), len) }
    }
}

fn block_size(len: usize) -> usize {
    (HEADER + len).div_ceil(ALIGN) * ALIGN
}

/// One segment of the host pool, as a ring.
#[derive(Debug)]
struct Ring {
    seg: Arc<Segment>,
    head: usize,
    tail: usize,
    /// Blocks allocated and not yet reclaimed.
    live: usize,
}

impl Ring {
    /// Moves the tail past every block the stub has freed, in order.
    fn reclaim(&mut self) {
        while self.live > 0 {
            if self.tail + HEADER > self.seg.len() {
                self.tail = 0;
                continue;
            }
            match self.seg.state(self.tail).load(Ordering::Acquire) {
                FREED => {
                    let len = self.seg.data_len(self.tail) as usize;
                    self.tail += block_size(len);
                    self.live -= 1;
                }
                WRAP => self.tail = 0,
                _ => break,
            }
        }
        if self.live == 0 {
            self.head = 0;
            self.tail = 0;
        }
    }

    /// The block offset for `size` bytes, or `None` when it does not fit now.
    fn place(&mut self, size: usize) -> Option<usize> {
        self.reclaim();
        let cap = self.seg.len();
        let at = if self.live == 0 {
            (size <= cap).then_some(0)?
        } else if self.head > self.tail {
            if cap - self.head >= size {
                self.head
            } else if size <= self.tail {
                if self.head + HEADER <= cap {
                    self.seg.set_header(self.head, WRAP, 0);
                }
                0
            } else {
                return None;
            }
        } else if self.head < self.tail && self.tail - self.head >= size {
            self.head
        } else {
            return None;
        };
        self.head = at + size;
        self.live += 1;
        Some(at)
    }
}

/// How a pool may grow.
#[derive(Debug, Clone, Copy)]
pub struct PoolSize {
    pub default: usize,
    pub growth: usize,
    pub limit: usize,
}

/// The server's pool: execute inputs and BLS outputs.
#[derive(Debug)]
pub struct HostPool {
    /// The label of its segments (`/memfd:<label>h<n>` in /proc/PID/maps).
    label: String,
    size: PoolSize,
    /// The stub's socket, which each new segment's descriptor goes down
    /// before any frame that names the segment.
    stub: Writer,
    rings: Vec<Ring>,
    total: usize,
    /// The ring that placed the last block: tried first.
    current: usize,
}

impl HostPool {
    pub fn new(label: &str, size: PoolSize, stub: Writer) -> Self {
        HostPool {
            label: label.to_string(),
            size,
            stub,
            rings: Vec::new(),
            total: 0,
            current: 0,
        }
    }

    /// Copies `parts` (one tensor's data, in order) into a new block and
    /// says where it is.
    pub fn write(&mut self, name: &str, datatype: &str, shape: &[i64], parts: &[&[u8]]) -> Result<Descriptor> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let descriptor = |seg: i64, off: usize| Descriptor {
            name: name.to_string(),
            datatype: datatype.to_string(),
            shape: shape.to_vec(),
            seg,
            off: off as u64,
            len: len as u64,
        };
        if len == 0 {
            return Ok(descriptor(-1, 0));
        }
        let (ring, block) = self.place(name, len)?;
        let seg = &self.rings[ring].seg;
        // SAFETY: the block is ours from `place` until the stub frees it.
        let data = unsafe { seg.bytes_mut(block + HEADER, len) };
        let mut at = 0;
        for part in parts {
            data[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        seg.set_header(block, LIVE, len as u64);
        Ok(descriptor(ring as i64, block + HEADER))
    }

    /// A block for `len` bytes: in a ring with room, or in a new segment.
    fn place(&mut self, name: &str, len: usize) -> Result<(usize, usize)> {
        let size = block_size(len);
        let count = self.rings.len();
        for i in 0..count {
            let ring = (self.current + i) % count;
            if let Some(block) = self.rings[ring].place(size) {
                self.current = ring;
                return Ok((ring, block));
            }
        }
        let wanted = match self.rings.is_empty() {
            true => self.size.default,
            false => self.size.growth,
        };
        let segment = wanted.max(size).div_ceil(4096) * 4096;
        if self.total + segment > self.size.limit {
            return Err(Error::unavailable(format!(
                "tensor '{name}' of {len} bytes does not fit in the instance's shared memory: {} bytes are in use and \
                 the limit is {} (--backend-config=python,shm-limit-byte-size)",
                self.total, self.size.limit
            )));
        }
        let n = self.rings.len();
        let failed = |e: io::Error| {
            Error::unavailable(format!(
                "failed to create a shared-memory segment of {segment} bytes: {e}"
            ))
        };
        let (seg, file) = Segment::create(&format!("{}h{n}", self.label), segment).map_err(failed)?;
        // Sent while this pool is locked: no frame naming the segment can
        // go before it.
        crate::channel::write_frame_with_fd(&mut self.stub.lock(), &ToStub::Segment { seg: n }, file.as_fd())
            .map_err(failed)?;
        self.total += segment;
        self.rings.push(Ring {
            seg: Arc::new(seg),
            head: 0,
            tail: 0,
            live: 0,
        });
        self.current = n;
        let block = self.rings[n].place(size).expect("a new segment fits its first block");
        Ok((n, block))
    }
}

/// The stub's segments, mapped as the stub announces them.
#[derive(Debug, Default)]
pub struct StubPool {
    segments: Vec<Arc<Segment>>,
}

impl StubPool {
    /// Maps segment `seg`, which the stub has just made; it numbers its
    /// segments from 0, in order.
    pub fn add(&mut self, seg: usize, fd: OwnedFd) -> std::result::Result<(), String> {
        if seg != self.segments.len() {
            return Err(format!(
                "it announced segment {seg} after {} others",
                self.segments.len()
            ));
        }
        if seg >= MAX_STUB_SEGMENTS {
            return Err(format!("it made more than {MAX_STUB_SEGMENTS} segments"));
        }
        let segment = Segment::from_fd(fd).map_err(|e| format!("its segment {seg} could not be mapped: {e}"))?;
        self.segments.push(Arc::new(segment));
        Ok(())
    }

    /// The data `descriptor` points at, without a copy: the block is freed
    /// when the bytes are dropped. A descriptor that does not name a live
    /// block of its length is refused (the stub's word is checked, never
    /// trusted).
    pub fn take(&mut self, descriptor: &Descriptor) -> Result<Bytes> {
        let bad = |why: &str| {
            Error::internal(format!(
                "the Python stub described tensor '{}' wrongly: {why}",
                descriptor.name
            ))
        };
        if descriptor.len == 0 {
            return Ok(Bytes::new());
        }
        let seg = usize::try_from(descriptor.seg)
            .ok()
            .and_then(|n| self.segments.get(n))
            .map(Arc::clone)
            .ok_or_else(|| bad("no such segment"))?;
        let off = usize::try_from(descriptor.off).map_err(|_| bad("offset out of range"))?;
        let len = usize::try_from(descriptor.len).map_err(|_| bad("length out of range"))?;
        if off < HEADER
            || !(off - HEADER).is_multiple_of(ALIGN)
            || off.checked_add(len).is_none_or(|end| end > seg.len())
        {
            return Err(bad("its data is not a block of the segment"));
        }
        let block = off - HEADER;
        if seg.state(block).load(Ordering::Acquire) != LIVE || seg.data_len(block) < len as u64 {
            return Err(bad("its block is not live or is shorter than the tensor"));
        }
        Ok(Bytes::from_owner(Block { seg, block, len }))
    }
}

/// A live block of the stub's pool: freed when dropped.
struct Block {
    seg: Arc<Segment>,
    block: usize,
    len: usize,
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: checked in bounds when taken; the stub does not touch a
        // block it has handed over until it is freed.
        unsafe { self.seg.bytes(self.block + HEADER, self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.seg.state(self.block).store(FREED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::FrameReader;
    use parking_lot::Mutex;
    use std::os::unix::net::UnixStream;

    /// A pool whose announcements go to the returned socket.
    fn host_pool(size: PoolSize) -> (HostPool, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        (HostPool::new("nereid-test-", size, Arc::new(Mutex::new(ours))), theirs)
    }

    /// The stub's side of a host block: what it reads, and its free.
    fn stub_reads(pool: &HostPool, d: &Descriptor) -> Vec<u8> {
        let seg = &pool.rings[d.seg as usize].seg;
        unsafe { seg.bytes(d.off as usize, d.len as usize) }.to_vec()
    }

    fn stub_frees(pool: &HostPool, d: &Descriptor) {
        let seg = &pool.rings[d.seg as usize].seg;
        seg.state(d.off as usize - HEADER).store(FREED, Ordering::Release);
    }

    #[test]
    fn the_ring_reuses_freed_blocks_grows_past_a_kept_one_and_stops_at_its_limit() {
        let size = PoolSize {
            default: 4096,
            growth: 8192,
            limit: 4096 + 8192,
        };
        let (mut pool, stub) = host_pool(size);
        let a = pool.write("A", "UINT8", &[1000], &[&[1u8; 600], &[2u8; 400]]).unwrap();
        assert_eq!(stub_reads(&pool, &a)[599..601], [1, 2]);
        assert_eq!((a.seg, a.off), (0, HEADER as u64));
        let b = pool.write("B", "UINT8", &[2000], &[&[3u8; 2000]]).unwrap();
        assert_eq!(b.seg, 0);
        // A is kept (a model holds it); B is freed: the next large one needs a new segment.
        stub_frees(&pool, &b);
        let c = pool.write("C", "UINT8", &[3000], &[&[4u8; 3000]]).unwrap();
        assert_eq!(c.seg, 1, "a kept block holds its ring");
        stub_frees(&pool, &a);
        stub_frees(&pool, &c);
        let d = pool.write("D", "UINT8", &[3900], &[&[5u8; 3900]]).unwrap();
        assert_eq!((d.seg, d.off), (1, HEADER as u64), "freed blocks are reused");
        let e = pool.write("E", "UINT8", &[4000], &[&[6u8; 4000]]).unwrap();
        assert_eq!((e.seg, e.off), (1, 3968 + HEADER as u64), "after D, in the same ring");
        let refused = pool.write("F", "UINT8", &[5000], &[&[7u8; 5000]]).unwrap_err();
        assert!(refused.message().contains("shm-limit-byte-size"), "{refused}");
        assert!(refused.message().contains("'F'"), "{refused}");
        let empty = pool.write("G", "FP32", &[0], &[]).unwrap();
        assert_eq!(empty.seg, -1);
        // Each segment was announced with its descriptor, in order.
        let mut announced = FrameReader::new(stub);
        drop(pool);
        for (n, size) in [(0usize, 4096u64), (1, 8192)] {
            let frame = announced.read_frame_as::<serde_json::Value>().unwrap().unwrap();
            assert_eq!(frame, serde_json::json!({"op": "segment", "seg": n}));
            let fd = announced.take_fd().unwrap();
            assert_eq!(File::from(fd).metadata().unwrap().len(), size);
        }
        assert!(announced.read_frame_as::<serde_json::Value>().unwrap().is_none());
    }

    #[test]
    fn the_ring_wraps_around_a_live_block() {
        let size = PoolSize {
            default: 4096,
            growth: 4096,
            limit: 4096,
        };
        let (mut pool, _stub) = host_pool(size);
        let a = pool.write("A", "UINT8", &[1500], &[&[1u8; 1500]]).unwrap();
        let b = pool.write("B", "UINT8", &[1500], &[&[2u8; 1500]]).unwrap();
        stub_frees(&pool, &a);
        // 1024 bytes are left at the end; 1500 wraps to the start, before B.
        let c = pool.write("C", "UINT8", &[1500], &[&[3u8; 1500]]).unwrap();
        assert_eq!((c.seg, c.off), (0, HEADER as u64));
        assert_eq!(stub_reads(&pool, &b), vec![2u8; 1500], "B is untouched");
        stub_frees(&pool, &b);
        stub_frees(&pool, &c);
        let d = pool.write("D", "UINT8", &[4000], &[&[4u8; 4000]]).unwrap();
        assert_eq!(d.off, HEADER as u64, "the wrap marker was reclaimed too");
    }

    #[test]
    fn stub_blocks_are_read_in_place_checked_and_freed_when_dropped() {
        let (seg, file) = Segment::create("nereid-test-s0", 4096).unwrap();
        seg.set_header(64, LIVE, 8);
        unsafe { seg.bytes_mut(64 + HEADER, 8) }.copy_from_slice(&7u64.to_le_bytes());
        let mut pool = StubPool::default();
        let (_, other) = Segment::create("nereid-test-s5", 4096).unwrap();
        assert!(
            pool.add(5, other.into())
                .unwrap_err()
                .contains("segment 5 after 0 others")
        );
        pool.add(0, file.into()).unwrap();
        let d = |seg: i64, off: u64, len: u64| Descriptor {
            name: "OUT".into(),
            datatype: "UINT64".into(),
            shape: vec![1],
            seg,
            off,
            len,
        };
        let bytes = pool.take(&d(0, 64 + HEADER as u64, 8)).unwrap();
        assert_eq!(bytes.as_ref(), 7u64.to_le_bytes());
        for wrong in [
            d(1, 80, 8),
            d(0, 81, 8),
            d(0, 80, 64),
            d(0, 4090, 8),
            d(0, 144, 8),
            d(5000, 80, 8),
        ] {
            assert!(pool.take(&wrong).is_err(), "{wrong:?}");
        }
        assert_eq!(seg.state(64).load(Ordering::Acquire), LIVE);
        let shared = bytes.slice(2..4);
        drop(bytes);
        assert_eq!(seg.state(64).load(Ordering::Acquire), LIVE, "a slice keeps it");
        drop(shared);
        assert_eq!(seg.state(64).load(Ordering::Acquire), FREED);
    }
}
