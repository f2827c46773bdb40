"""IR transforms of a training session, one per module, in the order of PopART's ``Ir::prepare``:
:mod:`.autodiff` (``constructBackwards``), :mod:`.optimizer` (the weight update ops)."""
