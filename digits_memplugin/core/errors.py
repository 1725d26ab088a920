"""Errors about a net or solver definition, carrying where the problem is (file, line, column, layer, field), and
the one error for untrusted input refused field by field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class MemPluginError(Exception):
    """Base of every error digits-memplugin raises on purpose."""


class FieldErrors(MemPluginError, ValueError):
    """Untrusted input refused field by field: `errors` maps each field at fault (a request's, a form's) to its
    message, or to a definition error as NetError.to_dict gives it. It is the REST API's 400 body
    (``{"errors": errors}``) and the form's messages beside its fields, so every front end catches this one error
    and answers with `errors` as they are. core/fields.py's checks raise it naming the field."""

    def __init__(self, errors: Mapping[str, Any]) -> None:
        super().__init__("; ".join(f"{key}: {value}" for key, value in errors.items()))
        self.errors = dict(errors)

    @classmethod
    def one(cls, field: str, message: Any) -> FieldErrors:
        """The refusal of one field."""
        return cls({field: message})

    @property
    def field(self) -> str:
        """The (first) field refused: the one field of a refusal made by `one`."""
        return next(iter(self.errors))

    @property
    def message(self) -> Any:
        """The (first) field's message."""
        return self.errors[self.field]


class NetError(MemPluginError, ValueError):
    """A net or solver definition the estimator cannot use. `str()` reads like a compiler message:

    ``net.prototxt:12:3: layer 'conv1' (Convolution): convolution_param.kernel_size: 7 exceeds the padded input 5``
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        column: int | None = None,
        layer: str | None = None,
        layer_type: str | None = None,
        field: str | None = None,
        missing_shape: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.line = line
        self.column = column
        self.layer = layer
        self.layer_type = layer_type
        self.field = field
        self.missing_shape = missing_shape
        """(data_shapes key, example shape) when the caller must give a data top's shape: each front end says how
        in its own terms (the CLI's --data-shape KEY=SHAPE, the form's Item shape field); the message does not."""

    def __str__(self) -> str:
        # f-strings throughout: a caller that passed a non-str source must still get a message, not a TypeError.
        where = ""
        if self.source is not None:
            where = f"{self.source}"
            if self.line is not None:
                where += f":{self.line}"
                if self.column is not None:
                    where += f":{self.column}"
            where += ": "
        what = ""
        if self.layer is not None:
            what = f"layer {self.layer!r}" + (f" ({self.layer_type})" if self.layer_type else "") + ": "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{what}{field}{self.message}"

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON for the API and the form: every location field, present or null."""
        return {
            "message": str(self),
            "detail": self.message,
            "source": self.source,
            "line": self.line,
            "column": self.column,
            "layer": self.layer,
            "layer_type": self.layer_type,
            "field": self.field,
        }


class PrototxtSyntaxError(NetError):
    """The text is not valid protobuf text format for the expected message."""


class ShapeError(NetError):
    """Shapes that Caffe would reject (it would abort with a CHECK failure)."""


class BatchLimitError(ShapeError):
    """A batch too large to build in one pass. Unlike other shape errors it depends on the batch: the planner treats
    such a batch as one that cannot fit, and reaches the wanted batch through iter_size."""

    elements: int | None = None
    """The element count of the blob that overflowed, when a blob did."""


class BlobLimitError(BatchLimitError):
    """A blob over Caffe's INT_MAX elements (Blob::Reshape's CHECK)."""


class UnrollLimitError(BatchLimitError):
    """A recurrent layer unrolled over more timesteps than the estimator builds (each one is several layers)."""


class BuildLimitError(UnrollLimitError):
    """A build that would set up more layers than the estimator builds at once (core/cost.py's MAX_BUILD_LAYERS):
    the nets its recurrent layers unroll are too large at this batch, a batch the planner treats as one that cannot
    be built."""


class UnsupportedLayerError(NetError):
    """A layer type neither the shape rules nor the pycaffe fallback can handle."""
