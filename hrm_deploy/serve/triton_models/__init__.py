"""Python-backend ``model.py`` files that ``hrm-deploy triton-repo`` copies into a repository.

They run inside Triton's Python backend stub, where hrm_deploy is not installed: each file is
self-contained (numpy, triton_python_backend_utils, and onnxruntime for ``ort_model``).
"""
