"""Source writing: ``to_source`` writes a recorded model as funcnet.nn Python a person would write.

``write`` is the entry point; ``classes`` unifies the instances of one torch class into one
function, ``specs`` describes and renders the children, ``forward`` and ``modes`` write a
forward's statements (train/eval and argument variants as ``if``s), ``text`` holds the
expression helpers.
"""
