//! A rank's calls run on the device in the order they were made, whatever streams they are
//! enqueued on.
//!
//! Why: a collective kernel reads and advances its rank's device generation, and its flags are
//! matched with the peers' kernels of the same call. Two kernels of one rank running at once —
//! calls on two streams, from two threads of one handle or one thread switching streams — would
//! race on that state and could pair a call with a peer's other call. The handle's call lock
//! orders the *enqueues*; this orders the *execution*: when a call comes on another stream than
//! the previous one, the new stream first waits for the previous call.
//!
//! Cost: nothing while a rank keeps to one stream (the common case). From the first stream
//! switch on, an event is recorded after every call (`cuEventRecord`, no timing) so that the
//! next switch can wait for it; the first switch itself, having no such event (the previous
//! stream may even be destroyed by now), synchronises the device once. While the new stream is
//! being captured into a graph no dependency is made (an event of uncaptured work cannot join a
//! capture): a graph's replays are ordered by the caller, as for any captured work.
use collective_core::Error;
use detcoll_protocol::{IpcDevice, RawStream};

/// What ordering needs from a device; implemented by every [`IpcDevice`].
pub(crate) trait OrderOps {
    type Event;
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn capturing(&self, stream: RawStream) -> Result<bool, Error>;
    fn new_event(&self) -> Result<Self::Event, Error>;
    /// # Safety
    /// As `capturing`.
    unsafe fn record_on(&self, event: &Self::Event, stream: RawStream) -> Result<(), Error>;
    /// # Safety
    /// As `capturing`.
    unsafe fn wait_on(&self, stream: RawStream, event: &Self::Event) -> Result<(), Error>;
    fn synchronize_all(&self) -> Result<(), Error>;
}

impl<D: IpcDevice> OrderOps for D {
    type Event = D::Event;
    unsafe fn capturing(&self, stream: RawStream) -> Result<bool, Error> {
        // SAFETY: forwarded.
        unsafe { self.is_capturing(stream) }
    }
    fn new_event(&self) -> Result<D::Event, Error> {
        self.event()
    }
    unsafe fn record_on(&self, event: &D::Event, stream: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.record(event, stream) }
    }
    unsafe fn wait_on(&self, stream: RawStream, event: &D::Event) -> Result<(), Error> {
        // SAFETY: forwarded.
        unsafe { self.wait_event(stream, event) }
    }
    fn synchronize_all(&self) -> Result<(), Error> {
        self.synchronize()
    }
}

/// The stream of a rank's previous call and, once the rank has switched streams, an event
/// recorded after its latest call. Lives under the handle's call lock.
#[derive(Debug)]
pub(crate) struct StreamOrder<E> {
    last: Option<RawStream>,
    tail: Option<E>,
    switched: bool,
}

impl<E> Default for StreamOrder<E> {
    fn default() -> Self {
        StreamOrder { last: None, tail: None, switched: false }
    }
}

impl<E> StreamOrder<E> {
    /// Before a call's launches on `stream`: makes `stream` wait for the previous call if that
    /// was on another stream.
    ///
    /// # Safety
    /// `stream` is a live stream of `ops`' device.
    pub(crate) unsafe fn before<O: OrderOps<Event = E>>(&mut self, ops: &O, stream: RawStream) -> Result<(), Error> {
        match self.last {
            Some(prev) if prev != stream => {}
            _ => return Ok(()),
        }
        self.switched = true;
        // SAFETY: `stream` is live (caller).
        if unsafe { ops.capturing(stream) }? {
            return Ok(());
        }
        match &self.tail {
            // SAFETY: as above; the event belongs to this device.
            Some(e) => unsafe { ops.wait_on(stream, e) },
            None => ops.synchronize_all(),
        }
    }

    /// After a call's launches on `stream` succeeded.
    ///
    /// # Safety
    /// As [`StreamOrder::before`].
    pub(crate) unsafe fn after<O: OrderOps<Event = E>>(&mut self, ops: &O, stream: RawStream) -> Result<(), Error> {
        self.last = Some(stream);
        if !self.switched {
            return Ok(());
        }
        // SAFETY: `stream` is live (caller).
        if unsafe { ops.capturing(stream) }? {
            // A captured call has not run; the event keeps marking the latest eager call.
            return Ok(());
        }
        if self.tail.is_none() {
            self.tail = Some(ops.new_event()?);
        }
        let e = self.tail.as_ref().expect("set above");
        // SAFETY: as above.
        unsafe { ops.record_on(e, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Logs what ordering asked of the device.
    #[derive(Default)]
    struct Log {
        ops: RefCell<Vec<String>>,
        capturing: Option<usize>,
    }
    impl OrderOps for Log {
        type Event = ();
        unsafe fn capturing(&self, s: RawStream) -> Result<bool, Error> {
            Ok(self.capturing == Some(s.0 as usize))
        }
        fn new_event(&self) -> Result<(), Error> {
            self.ops.borrow_mut().push("event".into());
            Ok(())
        }
        unsafe fn record_on(&self, _: &(), s: RawStream) -> Result<(), Error> {
            self.ops.borrow_mut().push(format!("record {}", s.0 as usize));
            Ok(())
        }
        unsafe fn wait_on(&self, s: RawStream, _: &()) -> Result<(), Error> {
            self.ops.borrow_mut().push(format!("wait {}", s.0 as usize));
            Ok(())
        }
        fn synchronize_all(&self) -> Result<(), Error> {
            self.ops.borrow_mut().push("sync".into());
            Ok(())
        }
    }

    fn call(o: &mut StreamOrder<()>, log: &Log, s: usize) {
        let s = RawStream(s as *mut _);
        // SAFETY: the log dereferences nothing.
        unsafe {
            o.before(log, s).unwrap();
            o.after(log, s).unwrap();
        }
    }

    #[test]
    fn one_stream_costs_nothing() {
        let (mut o, log) = (StreamOrder::default(), Log::default());
        for _ in 0..5 {
            call(&mut o, &log, 1);
        }
        assert!(log.ops.borrow().is_empty());
    }

    #[test]
    fn the_first_switch_synchronises_then_every_switch_waits_for_the_previous_call() {
        let (mut o, log) = (StreamOrder::default(), Log::default());
        call(&mut o, &log, 1);
        call(&mut o, &log, 2); // first switch: no event yet
        call(&mut o, &log, 2);
        call(&mut o, &log, 1); // waits for the event recorded after the last call on 2
        assert_eq!(*log.ops.borrow(), ["sync", "event", "record 2", "record 2", "wait 1", "record 1"]);
    }

    #[test]
    fn a_capturing_stream_makes_no_dependency() {
        let (mut o, mut log) = (StreamOrder::default(), Log::default());
        log.capturing = Some(3);
        call(&mut o, &log, 1);
        call(&mut o, &log, 3); // captured: no sync, no wait, no record
        call(&mut o, &log, 1); // eager again: no event yet, so the device is synchronised
        assert_eq!(*log.ops.borrow(), ["sync", "event", "record 1"]);
    }
}
