"""What a model stores: its tensors and shapes, parameter counts, the partition over devices and the model states.

:mod:`~memlib.model.blocks` (which optional blocks a model has, and the words for each) and
:mod:`~memlib.model.architecture` (parameter tensors with symbolic shapes) →
:mod:`~memlib.model.params` (counts per tensor, layer and model) →
:mod:`~memlib.model.partition` (layout, stages and what each device stores) →
:mod:`~memlib.model.states` (precision recipes, the ZeRO formula).
"""
