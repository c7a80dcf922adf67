"""The MuJoCo scene, its pick-the-cube task environment, the scripted expert and demonstrations."""
