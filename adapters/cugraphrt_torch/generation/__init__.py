"""The top floor: ``Generator``, greedy generation of a Hugging Face causal LM on the device
(``generation``), its device program (``_generation_program``) and options
(``_generation_options``). Built on capture, control and compile."""
