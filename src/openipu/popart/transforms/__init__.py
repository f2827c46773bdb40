"""IR transforms, one per module, in the order of PopART's ``Ir::prepare``:
:mod:`.graphcore_ir` (ai.graphcore Call / MultiConv built as ordinary ops, while the model is
read), :mod:`.random_seed` (``RandomSetup``: the random ops read the session's seed),
:mod:`.virtual_graphs` (the ops' virtual graphs and pipeline stages), then, in a
training session, :mod:`.autodiff` (``constructBackwards``) and :mod:`.optimizer` (the weight
update ops)."""
