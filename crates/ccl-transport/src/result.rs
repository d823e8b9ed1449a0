//! Error-returning wrappers: every `ncclResult_t` becomes a `Result` whose error carries the
//! library's own message (`ncclGetErrorString`, plus `ncclGetLastError` when available).
use crate::error::NcclError;
use crate::sys::{NcclLibrary, ncclComm_t, ncclResult_t, ncclUniqueId};
use crate::version::Version;
use core::ffi::{CStr, c_char, c_int};

/// Whether a successful call has finished or is still being carried out by the library (a
/// non-blocking communicator returns `ncclInProgress` until its state is `ncclSuccess`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Done,
    InProgress,
}

fn c_message(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: NCCL returns NUL-terminated static or per-thread strings, valid until the next call.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl NcclLibrary {
    /// `ncclGetErrorString(code)`.
    pub fn error_string(&self, code: ncclResult_t) -> String {
        // SAFETY: takes a plain int, returns a static string (or null for codes it does not know).
        c_message(unsafe { (self.fns().ncclGetErrorString)(code) }).unwrap_or_else(|| "no message".into())
    }

    /// `ncclGetLastError(comm)` where the library has it (the most specific message NCCL has).
    /// `comm` is a live communicator or null.
    pub(crate) fn last_error(&self, comm: ncclComm_t) -> Option<String> {
        let f = self.fns().ncclGetLastError?;
        // SAFETY: `comm` is a live communicator or null (the function ignores it in 2.28).
        c_message(unsafe { f(comm) }).filter(|m| !m.is_empty())
    }

    /// Turns `code`, returned by `call`, into a [`Progress`] or an error with messages
    /// (`comm`, live or null, is asked for its last error).
    pub(crate) fn check(
        &self,
        code: ncclResult_t,
        call: &'static str,
        comm: ncclComm_t,
    ) -> Result<Progress, NcclError> {
        match code {
            ncclResult_t::ncclSuccess => Ok(Progress::Done),
            ncclResult_t::ncclInProgress => Ok(Progress::InProgress),
            code => {
                let mut message = self.error_string(code);
                if let Some(last) = self.last_error(comm) {
                    message = format!("{message} ({last})");
                }
                Err(NcclError::Call { call, code, message })
            }
        }
    }

    /// The check of a call that never returns `ncclInProgress`: `Ok` or the error with its message.
    pub fn check_done(&self, code: ncclResult_t, call: &'static str) -> Result<(), NcclError> {
        match self.check(code, call, core::ptr::null_mut())? {
            Progress::Done => Ok(()),
            Progress::InProgress => Err(NcclError::Call { call, code, message: "unexpected ncclInProgress".into() }),
        }
    }

    /// `ncclGetVersion`.
    pub fn version(&self) -> Result<Version, NcclError> {
        let mut code: c_int = 0;
        // SAFETY: out-pointer to a local.
        let r = unsafe { (self.fns().ncclGetVersion)(&mut code) };
        self.check_done(r, "ncclGetVersion")?;
        Ok(Version::from_code(code))
    }

    /// `ncclGetUniqueId`: a fresh id (rank 0 calls this once per communicator; it also starts
    /// NCCL's bootstrap root on this host).
    pub fn unique_id(&self) -> Result<ncclUniqueId, NcclError> {
        let mut id = ncclUniqueId::zeroed();
        // SAFETY: out-pointer to a local of the right size (checked at compile time).
        let r = unsafe { (self.fns().ncclGetUniqueId)(&mut id) };
        self.check_done(r, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// `ncclGroupStart`.
    pub fn group_start(&self) -> Result<(), NcclError> {
        // SAFETY: no arguments; balanced by `group_end` (callers use `Communicator::group`).
        let r = unsafe { (self.fns().ncclGroupStart)() };
        self.check_done(r, "ncclGroupStart")
    }

    /// `ncclGroupEnd`: `InProgress` on a non-blocking communicator whose work is still being
    /// set up (the caller polls the communicator until done).
    pub fn group_end(&self, comm: ncclComm_t) -> Result<Progress, NcclError> {
        // SAFETY: no arguments; closes the group opened by `group_start`.
        let r = unsafe { (self.fns().ncclGroupEnd)() };
        self.check(r, "ncclGroupEnd", comm)
    }
}
