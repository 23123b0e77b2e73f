"""The backend's id, ``"RustConvBackend"``: one definition for the Python side.

ExecuTorch names a delegate by its ``BackendDetails`` class
(:class:`rustconv.backend.RustConvBackend`, whose name is checked against
this at import) and the runtime registers itself under the same name
(``delegate/src``). Standard library only: the runtime loader, the
developer tools and the tests import it without the export side.
"""

__all__ = ["BACKEND_ID"]

BACKEND_ID = "RustConvBackend"
