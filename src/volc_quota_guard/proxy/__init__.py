"""The LiteLLM side: the callback (hook.py), what it reads of a LiteLLM call, refusals, log
lines, and the wiring of the proxy process (runtime.py). Nothing below this folder imports it.
"""
